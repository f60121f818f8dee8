#!/usr/bin/env bash
# Tests a dash_attn wheel (scripts/build_wheel.sh) the way a user gets it: installed with pip into a fresh
# virtual environment, from a directory outside the repository, with no DASH_ATTN_LIBRARY or PYTHONPATH.
#   usage: scripts/test_wheel.sh [--gpu | --no-gpu] [--complete] WHEEL_FILE
#
# Both modes: the wheel installs without its dependencies and without an index (no network needed); the
# installed package and library are the wheel's (not a copy elsewhere on sys.path); every dependency of
# libdash_attn_c.so resolves except, possibly, the driver's libcuda.so.1; `python -m dash_attn.info` runs.
# --gpu (default; the GPU machine): info must say "ready"; the CUDA libraries the process has mapped after
#   the library ran on the GPU (before torch is imported) must be the driver's alone, no toolkit library;
#   then a forward and backward pass of every compiled kernel (head dims, dtypes; causal and full; GQA)
#   against torch's SDPA in float32, and two backward passes bit for bit. torch comes from the interpreter
#   that creates the environment (its site-packages are put on the environment's sys.path after the
#   environment's own): $DASH_WHEEL_PYTHON, else the first of python3, /opt/torch/.venv/bin/python that
#   imports torch.
# --no-gpu (the build machine): info must exit 1 and say why (no driver, no device); torch is not needed.
# --complete (scripts/build_wheel.sh passes it for its default kernel set): the library must have every head dim
#   and dtype the package knows, each with its softcap, varlen and varlen softcap kernels.
# Environment: DASH_WHEEL_PYTHON (the interpreter), DASH_WHEEL_VENV (where to create the environment; default:
# a new temporary directory, removed afterwards unless DASH_WHEEL_KEEP=1), DASH_WHEEL_TIMEOUT (seconds each
# Python step may take, default 600).
set -uo pipefail

mode=gpu
complete=0
while [ $# -gt 1 ]; do
  case $1 in
    --gpu) mode=gpu; shift ;;
    --no-gpu) mode=no-gpu; shift ;;
    --complete) complete=1; shift ;;
    *) break ;;
  esac
done
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
  echo "usage: $0 [--gpu | --no-gpu] [--complete] WHEEL_FILE   (${1:-no wheel given}: not a file)" >&2
  exit 2
fi
wheel=$(realpath "$1")
say() { echo "test_wheel: $*"; }
fail() { echo "test_wheel: FAILED: $*" >&2; exit 1; }

say "wheel $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB), mode $mode"
case $(basename "$wheel") in
  *manylinux*_x86_64.whl) ;;
  *) fail "$(basename "$wheel") is not a manylinux x86_64 wheel" ;;
esac

# The interpreter: one that has torch on the GPU machine.
candidates=()
[ -n "${DASH_WHEEL_PYTHON:-}" ] && candidates+=("$DASH_WHEEL_PYTHON")
candidates+=(python3 /opt/torch/.venv/bin/python /opt/torch/.venv/bin/python3)
python=""
for candidate in "${candidates[@]}"; do
  command -v "$candidate" >/dev/null 2>&1 || continue
  if [ "$mode" = no-gpu ] || "$candidate" -c "import torch" >/dev/null 2>&1; then
    python=$(command -v "$candidate")
    break
  fi
done
[ -n "$python" ] || fail "no interpreter with torch among: ${candidates[*]} (set DASH_WHEEL_PYTHON)"
say "interpreter $python ($("$python" -c 'import sys; print(sys.version.split()[0])'))"

unset DASH_ATTN_LIBRARY PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONNOUSERSITE
# pip's configuration (PIP_USER, PIP_TARGET, an index, pip.conf) must not move or change the install.
while read -r var; do unset "$var"; done < <(compgen -e | grep '^PIP_')
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
# Toolkit directories on LD_LIBRARY_PATH would hide a dependency on the toolkit: keep only directories
# without a CUDA runtime or compiler library in them (the driver's directory, if listed, stays).
if [ -n "${LD_LIBRARY_PATH:-}" ]; then
  kept=()
  IFS=: read -ra dirs <<< "$LD_LIBRARY_PATH"
  for dir in "${dirs[@]}"; do
    if compgen -G "$dir/libcudart.so*" >/dev/null || compgen -G "$dir/libnvrtc.so*" >/dev/null; then
      say "dropping $dir from LD_LIBRARY_PATH (a CUDA toolkit directory)"
    else
      kept+=("$dir")
    fi
  done
  LD_LIBRARY_PATH=$(IFS=:; echo "${kept[*]:-}")
  export LD_LIBRARY_PATH
fi

venv=${DASH_WHEEL_VENV:-$(mktemp -d /tmp/dash-wheel-test.XXXXXX)/venv}
cleanup() { [ "${DASH_WHEEL_KEEP:-0}" = 1 ] || [ -n "${DASH_WHEEL_VENV:-}" ] || rm -rf "$(dirname "$venv")"; }
trap cleanup EXIT
rm -rf "$venv"
# Not --system-site-packages: that would also run the base's .pth files, and an editable install of dash_attn
# there (a meta path finder) would shadow the wheel. The base's site-packages (torch) are listed in a .pth
# file instead, which appends them to sys.path after the environment's own, without running their .pth
# files; for an interpreter that is itself a virtual environment these are its own site-packages.
if ! "$python" -m venv "$venv" >/dev/null 2>&1; then
  # No ensurepip (Debian without python3-venv): an environment without pip; the base's pip installs into it.
  rm -rf "$venv"
  "$python" -m venv --without-pip "$venv" || fail "cannot create a virtual environment"
fi
vpython="$venv/bin/python"
# Every Python step runs under a time limit, so a hung kernel fails the test instead of blocking it.
run_python() { timeout "${DASH_WHEEL_TIMEOUT:-600}" "$vpython" "$@"; }
site=$("$vpython" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$python" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
  > "$site/zz_dash_wheel_test_base.pth" || fail "cannot list the site-packages of $python"
say "environment $venv"

workdir=$(dirname "$venv")
cd "$workdir" || fail "cannot cd to $workdir"
if "$vpython" -m pip --version >/dev/null 2>&1; then
  "$vpython" -m pip install --quiet --no-deps --no-index --no-cache-dir --force-reinstall "$wheel" || fail "pip install of the wheel failed"
else
  say "no pip in the environment nor its base: unpacking the wheel into $site"
  "$vpython" -m zipfile -e "$wheel" "$site" || fail "cannot unpack the wheel"
fi

# The package and the library must be the wheel's, and load from the new environment.
"$vpython" - "$venv" <<'EOF' || fail "the installed package is not the wheel's"
import os, sys
venv = os.path.realpath(sys.argv[1])
import dash_attn
from dash_attn import _library
package = os.path.realpath(os.path.dirname(dash_attn.__file__))
library = os.path.realpath(str(_library.library_path()))
print(f"test_wheel: package {package}\ntest_wheel: library {library}")
for what, path in (("package", package), ("library", library)):
    if not path.startswith(venv + os.sep):
        sys.exit(f"test_wheel: the {what} loads from {path}, outside {venv} (another dash_attn on sys.path?)")
EOF
library=$("$vpython" -c 'from dash_attn import _library; print(_library.library_path())')

# Every dependency resolves; libcuda.so.1 is the driver's and is either linked or opened at run time.
say "ldd $library:"
ldd "$library" | sed 's/^/  /'
unresolved=$(ldd "$library" | grep 'not found' | grep -v 'libcuda\.so\.1' || true)
[ -z "$unresolved" ] || fail "unresolved dependencies: $unresolved"
# The libraries it names (NEEDED); without binutils, every library ldd lists (a superset).
if command -v readelf >/dev/null; then
  needed=$(readelf -d "$library" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
else
  needed=$(ldd "$library" | awk '{print $1}' | sed 's|.*/||')
fi
if grep -q '^libcuda\.so' <<< "$needed"; then
  say "libcuda.so.1: linked (NEEDED)"
else
  say "libcuda.so.1: not linked; the static CUDA runtime opens it when the library first calls CUDA"
fi
toolkit=$(grep -E '^lib(cu|nv)' <<< "$needed" | grep -v '^libcuda\.so' || true)
[ -z "$toolkit" ] || fail "the library needs CUDA toolkit libraries: $toolkit"

if [ "$complete" = 1 ]; then
  run_python - <<'EOF' || fail "the wheel lacks kernels of the default set"
from dash_attn import _library
missing = []
for head_dim in _library.HEAD_DIMS:
    for code, name in _library.DTYPE_NAMES.items():
        for what, available in (
            ("dense", _library.kernel_available(head_dim, code)),
            ("softcap", _library.kernel_available(head_dim, code, softcap=True)),
            ("varlen", _library.kernel_available(head_dim, code, varlen=True)),
            ("varlen softcap", _library.kernel_available(head_dim, code, softcap=True, varlen=True)),
        ):
            if not available:
                missing.append(f"head_dim {head_dim} {name} {what}")
if missing:
    raise SystemExit("test_wheel: missing kernels: " + ", ".join(missing))
print(f"test_wheel: complete: head dims {_library.HEAD_DIMS}, {sorted(_library.DTYPE_NAMES.values())}, "
      "each with softcap, varlen and varlen softcap kernels")
EOF
fi

say "python -m dash_attn.info:"
info_out=$(run_python -m dash_attn.info 2>&1)
info_rc=$?
printf '  %s\n' "${info_out//$'\n'/$'\n'  }"
say "dash_attn.info exit $info_rc"

if [ "$mode" = no-gpu ]; then
  [ "$info_rc" -eq 1 ] || fail "without a GPU, dash_attn.info should exit 1 (cannot run here), not $info_rc"
  echo "$info_out" | grep -q '^dash_attn cannot run here: .*\(driver\|device\)' \
    || fail "dash_attn.info does not say that the driver or the device is missing"
  echo "$info_out" | grep -q '^kernels: head_dim' || fail "dash_attn.info lists no kernels"
  say "PASSED (no GPU here: the wheel installs, its library loads and says why it cannot run)"
  exit 0
fi

[ "$info_rc" -eq 0 ] || fail "dash_attn.info says DASH cannot run here (see above)"

# On the GPU, in a process without torch (whose wheels bring their own CUDA libraries): once the library has
# described and checked the device (its static CUDA runtime initialised, the driver loaded), the process
# maps the driver's libcuda and no library of the CUDA toolkit. The environment can import torch, and the
# package imports it when it can, so torch is blocked here: the package then loads without its entry points.
run_python - <<'EOF' || fail "the library loaded CUDA toolkit libraries"
import re, sys
sys.modules["torch"] = None  # `import torch` raises ImportError from here on
from dash_attn import _library
_library.load()
_library.check_device()
device = _library.describe_current_device()
print(f"test_wheel: device {device.name.decode(errors='replace')}, {device.multiprocessor_count} SMs")
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if ".so" in line.split()[-1]})
if any(re.search(r"/libtorch[^/]*\.so", path) for path in mapped):
    sys.exit("test_wheel: torch was loaded although it was blocked, so this check would prove nothing")
cuda = [path for path in mapped if re.search(r"/lib(cu|nv)[^/]*\.so", path)]
print("test_wheel: CUDA libraries mapped: " + (", ".join(cuda) or "none"))
if not any(re.search(r"/libcuda\.so", path) for path in cuda):
    sys.exit("test_wheel: the driver's libcuda.so is not mapped after the device check")
# The toolkit's libraries (the driver's are libcuda, libcudadebugger and libnvidia-*).
toolkit = [path for path in cuda if re.search(
    r"/lib(cudart|cublas|cublasLt|cufft|curand|cusparse|cusolver|nvrtc|nvJitLink|nvToolsExt|cupti|cudnn|nccl)[^/]*\.so", path)]
if toolkit:
    sys.exit(f"test_wheel: toolkit libraries mapped: {toolkit}")
EOF

say "forward and backward against torch SDPA:"
run_python - <<'EOF' || fail "forward/backward check against SDPA (exit 124 is a timeout)"
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import dash_attn
from dash_attn import _library

torch.manual_seed(0)
device = torch.device("cuda")
dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
# python/tests/test_attention.py's tolerances against float32 SDPA: (relative L2, max error relative to the
# largest reference value, at least MAGNITUDE_FLOOR).
tolerances = {torch.bfloat16: (1.5e-2, 5e-2), torch.float16: (4e-3, 1.5e-2)}
MAGNITUDE_FLOOR = 1e-2
kernels = _library.compiled_kernels()
assert kernels, "the library lists no kernels"
failures = 0
for head_dim, dtype_name in kernels:
    dtype = dtypes[dtype_name]
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, causal): ragged lengths, Sq != Sk, GQA.
    for batch, seqlen_q, seqlen_k, heads_q, heads_kv, causal in (
        (2, 256, 256, 4, 4, False),
        (2, 300, 300, 4, 4, True),
        (1, 130, 520, 8, 2, True),
        (1, 515, 260, 6, 3, False),
    ):
        def draw(seqlen, heads):
            return torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype, requires_grad=True)

        q, k, v = draw(seqlen_q, heads_q), draw(seqlen_k, heads_kv), draw(seqlen_k, heads_kv)
        dout = torch.randn(batch, seqlen_q, heads_q, head_dim, device=device, dtype=dtype)

        def run():
            for t in (q, k, v):
                t.grad = None
            out = dash_attn.flash_attn_func(q, k, v, causal=causal)
            out.backward(dout)
            return out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()

        got = run()
        again = run()
        # Reference: float32 SDPA in (B, H, S, D); causal is bottom-right aligned, as in FlashAttention.
        ref_in = [t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v)]
        group = heads_q // heads_kv
        k32 = ref_in[1].repeat_interleave(group, dim=1)
        v32 = ref_in[2].repeat_interleave(group, dim=1)
        mask = None
        if causal:
            rows = torch.arange(seqlen_q, device=device)[:, None]
            cols = torch.arange(seqlen_k, device=device)[None, :]
            mask = cols <= rows + (seqlen_k - seqlen_q)
        with sdpa_kernel(SDPBackend.MATH):
            ref_out = F.scaled_dot_product_attention(ref_in[0], k32, v32, attn_mask=mask)
        ref_out.backward(dout.float().transpose(1, 2))
        expected = [ref_out.detach()] + [t.grad for t in ref_in]
        rel_tol, max_tol = tolerances[dtype]
        shape = f"hdim{head_dim} {dtype_name} B{batch} Sq{seqlen_q} Sk{seqlen_k} H{heads_q}/{heads_kv} {'causal' if causal else 'full'}"
        report = []
        for name, actual, reference in zip(("out", "dq", "dk", "dv"), got, expected):
            actual, reference = actual.double().transpose(1, 2), reference.double()
            error = (actual - reference).abs()
            norm = reference.norm().item()
            rel = (actual - reference).norm().item() / (norm if norm > 0 else 1.0)
            bound = max_tol * max(reference.abs().max().item(), MAGNITUDE_FLOOR)
            ok = rel <= rel_tol and error.max().item() <= bound and torch.isfinite(actual).all().item()
            report.append(f"{name} {rel:.2e}{'' if ok else ' FAIL'}")
            failures += not ok
        bitwise = all(torch.equal(a, b) for a, b in zip(got, again))
        failures += not bitwise
        # For scale: torch's own SDPA (its default backend) in the same dtype, forward output only.
        with torch.no_grad():
            native = F.scaled_dot_product_attention(
                *(t.detach().transpose(1, 2) for t in (q, k, v)), attn_mask=mask, enable_gqa=group > 1
            )
        native_rel = (native.double() - expected[0].double()).norm().item() / expected[0].norm().item()
        print(f"  {shape}: rel L2 " + ", ".join(report) + f" (torch {dtype_name} SDPA out {native_rel:.2e}); "
              f"two runs {'bitwise equal' if bitwise else 'DIFFER'}")
torch.cuda.synchronize()
if failures:
    raise SystemExit(f"{failures} check(s) failed")
EOF
say "PASSED (GPU: the wheel installs and runs forward and backward without the CUDA toolkit)"
