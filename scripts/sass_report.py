#!/usr/bin/env python3
"""Parses and compares SASS for scripts/sass_report.sh (usage, tools and output are described there).

  sass_report.py --cuobjdump PATH --nvdisasm PATH [--csv FILE] [--loops] [FILE ...]
  sass_report.py --diff OLD.csv NEW.csv

Without FILE it reads every kernel instance object under build/src/kernels/. Each FILE (object,
executable, shared library or .cubin) has its cubins extracted by cuobjdump and disassembled by
nvdisasm; each kernel gets one Markdown row: resources, whole-kernel counts and MMA step loop counts.

How the MMA step loop is found (find_loops, find_step_loop):
  1. The kernel's SASS is cut into basic blocks: a block starts at the entry, at every label that a
     BRA (BRA.DIV, BRA.U.ANY too) or BRX jumps to, and after every branch, EXIT and RET. Edges: a
     branch goes to its target (BRX to the targets nvdisasm lists as BRANCH_TARGETS) and, if it is
     predicated or depends on divergence (BRA.DIV, BRA.U.ANY), also to the next block; an
     unpredicated EXIT or RET ends the path; CALL falls through (the callee is not followed).
  2. Dominators are computed from the entry. An edge whose target dominates its source is a back
     edge, its target a loop header; the loop is the header plus every block that reaches a back
     edge's source without passing through the header (the natural loop). So the code that ptxas
     moves behind the kernel's EXIT and that jumps back into the loop (mbarrier try-wait retries,
     the BRA.DIV slow path of warp shuffles) belongs to the loop, and that jump back is not taken
     for a loop, as it would be with "any BRA to a lower address".
  3. The step loop is, among the innermost loops with HGMMA (loops with HGMMA containing no smaller
     loop with HGMMA), the one with the most HGMMA; ties go to the lower address. In the
     warp-specialized kernels only the MMA warpgroups (setmaxnreg 240) issue HGMMA, so this is
     their per-step loop, not the producer's (setmaxnreg 24) or the dQ writer's loops.
  4. Step path: the fewest and the most instructions on a path from the header to a back edge
     (inner loops' back edges dropped, so a retry loop counts once). The fewest is the step as one
     MMA thread runs it when no wait retries and no conditional code (the causal mask) runs.
  Checked by reading backward_kernel<hd128,bf16> at a98130b: the loop found (0xc10-0x4110, closed by
  `@!P0 BRA .L_x_38` back to 0xc10) is the MMA warpgroups' step: Q/dO stage wait, S and dP (16
  HGMMA), exp2 with an unmasked (70 instructions) and a masked (257) copy, dV, dS to shared memory,
  the named barrier of the two MMA warpgroups, dQ and dK (16 HGMMA), stage release.
Limits: the counts are static (instructions in the code, not executed): both sides of a branch in
the step count, and so do the retry and slow paths that run only when a wait fails or a warp
diverges. A rolled loop inside the step (none in these kernels: CuTe unrolls the k-blocks) would be
reported instead of the step. Irreducible loops (entered other than through their header) are not
found. Code reached only through CALL counts in the kernel totals but is not searched for loops.
Spill bytes are not stored in the cubin (only ptxas prints them while compiling), so local memory
is shown as LDL / STL instruction counts (spill reloads and spills, and any local arrays).
"""

import argparse
import csv
import os
import pathlib
import re
import subprocess
import sys
import tempfile

# HGMMA.WAIT counts the warpgroup waits (WARPGROUP.DEPBAR): a few per step where the code waits, one after nearly
# every HGMMA where ptxas serialized the wgmma pipeline (its warning C7512).
COUNTED_OPCODES = [
    "HGMMA",
    "HGMMA.WAIT",
    "STSM",
    "LDSM",
    "LDL",
    "STL",
    "R2UR",
    "STG",
    "ST/STS",
    "BAR",
    "SHFL",
    "MUFU.EX2",
]
DTYPE_NAMES = {
    "bfloat16_t": "bf16",
    "half_t": "fp16",
    "__nv_bfloat16": "bf16",
    "__half": "fp16",
    "float_e4m3_t": "e4m3",
    "float_e5m2_t": "e5m2",
    "float": "fp32",
}
REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OBJECT_PATTERN = ("build/src/kernels", "instance_*.cu.o")
FIELDS = (
    [
        "file",
        "kernel",
        "registers",
        "setmaxnreg",
        "stack_bytes",
        "kernel_instructions",
        "loop_range",
        "loop_instructions",
        "loop_path_min",
        "loop_path_max",
    ]
    + ["loop_" + o for o in COUNTED_OPCODES]
    + ["kernel_" + o for o in COUNTED_OPCODES]
)
FIELDS_NOT_DIFFED = ("file", "kernel", "loop_range")  # the loop's addresses move with any code change

INSTRUCTION_RE = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(?:@(!?U?P(?:T|\d+))\s+)?([A-Z][A-Z0-9_.]*)(.*)$")
LABEL_RE = re.compile(r"^(\S+):\s*$")
SECTION_RE = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
BRANCH_TARGET_RE = re.compile(r"`\(([^)]+)\)")
BRX_TARGETS_RE = re.compile(r'BRANCH_TARGETS ([^"]+)"')
SETMAXNREG_RE = re.compile(r"(0x[0-9a-f]+)\s*;")


def opcode_category(opcode):
    """The COUNTED_OPCODES entry that this opcode counts towards, or None."""
    if opcode.startswith("MUFU.EX2"):
        return "MUFU.EX2"
    if opcode.startswith("WARPGROUP.DEPBAR"):
        return "HGMMA.WAIT"
    base = opcode.split(".")[0]
    if base in ("ST", "STS"):
        return "ST/STS"
    return base if base in COUNTED_OPCODES else None


class Instruction:
    """One SASS instruction and, for branches, the labels it can jump to."""

    def __init__(self, address, predicate, opcode, operands, labels):
        self.address = address
        self.opcode = opcode
        self.operands = operands
        self.labels = labels
        base = opcode.split(".")[0]
        self.is_branch = base in ("BRA", "BRX")
        self.ends_path = base in ("EXIT", "RET")
        self.never_runs = predicate == "!PT"
        self.conditional = predicate not in (None, "PT") or ".DIV" in opcode or ".ANY" in opcode
        if base == "BRX":
            listed = BRX_TARGETS_RE.search(operands)
            self.targets = listed.group(1).split(",") if listed else []
        elif base == "BRA":
            self.targets = BRANCH_TARGET_RE.findall(operands)
        else:
            self.targets = []

    def is_hgmma(self):
        return self.opcode.startswith("HGMMA")


def parse_nvdisasm(text):
    """{mangled kernel name: [Instruction]} from `nvdisasm -c` output."""
    kernels = {}
    current = None
    pending_labels = []
    for line in text.splitlines():
        section = SECTION_RE.match(line)
        label = LABEL_RE.match(line)
        instruction = INSTRUCTION_RE.match(line)
        if section:
            current = kernels.setdefault(section.group(1), [])
            pending_labels = []
        elif label:
            pending_labels.append(label.group(1))
        elif instruction and current is not None:
            address, predicate, opcode, operands = instruction.groups()
            current.append(Instruction(int(address, 16), predicate, opcode, operands, pending_labels))
            pending_labels = []
    return kernels


def strip_padding(instructions):
    """The instructions without the section's end padding (a branch to itself, then NOPs)."""
    end = len(instructions)
    while end and instructions[end - 1].opcode == "NOP":
        end -= 1
    last = instructions[end - 1] if end else None
    if last and last.opcode == "BRA" and set(last.targets) & set(last.labels):
        end -= 1
    return instructions[:end]


class ControlFlowGraph:
    """Basic blocks of one kernel, their edges, reverse postorder and immediate dominators."""

    def __init__(self, instructions):
        self.instructions = instructions
        label_index = {label: i for i, ins in enumerate(instructions) for label in ins.labels}
        leaders = {0}
        for i, ins in enumerate(instructions):
            if ins.is_branch or ins.ends_path:
                leaders.add(i + 1)
            leaders.update(label_index[t] for t in ins.targets if t in label_index)
        starts = sorted(s for s in leaders if s < len(instructions))
        self.blocks = list(zip(starts, starts[1:] + [len(instructions)]))  # [first, end) indices
        block_at = {first: b for b, (first, _) in enumerate(self.blocks)}
        self.successors = []
        for b, (_, end) in enumerate(self.blocks):
            last = instructions[end - 1]
            successors = set()
            if last.is_branch and not last.never_runs:
                successors.update(block_at[label_index[t]] for t in last.targets if t in label_index)
            if not (last.is_branch or last.ends_path) or last.conditional or last.never_runs:
                successors.update([b + 1] if b + 1 < len(self.blocks) else [])
            self.successors.append(sorted(successors))
        self.predecessors = [[] for _ in self.blocks]
        for b, successors in enumerate(self.successors):
            for s in successors:
                self.predecessors[s].append(b)
        self.rank = {b: i for i, b in enumerate(self._reverse_postorder())}
        self.idom = self._immediate_dominators()

    def size(self, block):
        first, end = self.blocks[block]
        return end - first

    def block_instructions(self, block):
        return self.instructions[slice(*self.blocks[block])]

    def _reverse_postorder(self):
        """Blocks reachable from the entry, each after all its predecessors but those of back edges."""
        postorder = []
        seen = {0}
        stack = [(0, iter(self.successors[0]))]
        while stack:
            block, successors = stack[-1]
            unseen = next((s for s in successors if s not in seen), None)
            if unseen is None:
                postorder.append(block)
                stack.pop()
            else:
                seen.add(unseen)
                stack.append((unseen, iter(self.successors[unseen])))
        return postorder[::-1]

    def _immediate_dominators(self):
        """Cooper, Harvey and Kennedy's iterative algorithm, over the reachable blocks."""
        order = sorted(self.rank, key=self.rank.get)
        idom = {0: 0}

        def common_dominator(a, b):
            while a != b:
                while self.rank[a] > self.rank[b]:
                    a = idom[a]
                while self.rank[b] > self.rank[a]:
                    b = idom[b]
            return a

        changed = True
        while changed:
            changed = False
            for block in order[1:]:
                processed = [p for p in self.predecessors[block] if p in idom]
                dominator = processed[0]
                for p in processed[1:]:
                    dominator = common_dominator(p, dominator)
                if idom.get(block) != dominator:
                    idom[block] = dominator
                    changed = True
        return idom

    def dominates(self, a, b):
        while b != a and b != 0:
            b = self.idom[b]
        return b == a


class Loop:
    """A natural loop: its blocks, address range (header to the last back edge) and step paths."""

    def __init__(self, graph, header, latches, blocks):
        self.blocks = blocks
        self.instructions = [ins for b in sorted(blocks) for ins in graph.block_instructions(b)]
        self.first_address = graph.block_instructions(header)[0].address
        self.last_address = max(graph.block_instructions(b)[-1].address for b in latches)
        self.hgmma = sum(1 for ins in self.instructions if ins.is_hgmma())
        self.path_min, self.path_max = self._path_lengths(graph, header, latches)
        self.depth = 0

    def _path_lengths(self, graph, header, latches):
        """Fewest and most instructions from the header to a back edge, forward edges only."""
        shortest = {header: graph.size(header)}
        longest = dict(shortest)
        for block in sorted(self.blocks, key=graph.rank.get):
            if block not in shortest:
                continue
            for s in graph.successors[block]:
                if s in self.blocks and graph.rank[s] > graph.rank[block]:
                    shortest[s] = min(shortest.get(s, sys.maxsize), shortest[block] + graph.size(s))
                    longest[s] = max(longest.get(s, 0), longest[block] + graph.size(s))
        reached = [b for b in latches if b in shortest]  # all of them unless the loop is irreducible
        return min(shortest[b] for b in reached), max(longest[b] for b in reached)

    def address_range(self):
        return f"0x{self.first_address:x}-0x{self.last_address:x}"


def find_loops(instructions):
    """Every natural loop of the kernel (merged per header), with its nesting depth."""
    graph = ControlFlowGraph(instructions)
    latches_of = {}
    for source in graph.idom:
        for target in graph.successors[source]:
            if target in graph.idom and graph.dominates(target, source):
                latches_of.setdefault(target, []).append(source)
    loops = []
    for header, latches in latches_of.items():
        blocks = {header}
        work = list(latches)
        while work:
            block = work.pop()
            if block not in blocks:
                blocks.add(block)
                work.extend(p for p in graph.predecessors[block] if p in graph.idom)
        loops.append(Loop(graph, header, latches, blocks))
    for loop in loops:
        loop.depth = sum(1 for other in loops if loop.blocks < other.blocks)
    return sorted(loops, key=lambda loop: loop.first_address)


def find_step_loop(loops):
    """The innermost loop with HGMMA that has the most HGMMA (see the module comment), or None."""
    with_hgmma = [loop for loop in loops if loop.hgmma]
    innermost = [loop for loop in with_hgmma if not any(other.blocks < loop.blocks for other in with_hgmma)]
    return max(innermost, key=lambda loop: (loop.hgmma, -loop.first_address), default=None)


def count_opcodes(instructions):
    counts = dict.fromkeys(COUNTED_OPCODES, 0)
    for ins in instructions:
        category = opcode_category(ins.opcode)
        if category:
            counts[category] += 1
    return counts


def short_kernel_name(demangled):
    """`backward_kernel<hd128,bf16>` from `void dash::sm90::backward_kernel<...<128, ...bfloat16_t>>(...)`, and
    `forward_kernel<hd128,bf16,128x176>` from `...forward_kernel<...ForwardConfig<128, ...bfloat16_t, 128, 176>>`:
    a configuration's numbers after the head dim are its tile shape, which tells one head dim's kernels apart, and
    `softcap`, `left-window`, `varlen`, `paired` and `dealt` mark the softcap kernels, the forward's kernels for a left
    window bound, the kernels of packed varlen batches, the forward's CTA pairs and the forward's kernels whose CTAs
    deal the tiles among themselves."""
    head = demangled.split("(")[0].removeprefix("void ")
    if "<" not in head:
        return head.split("::")[-1]
    name, arguments = head.split("<", 1)
    numbers = re.findall(r"\b(\d+)\b", arguments)
    parts = ["hd" + n for n in numbers[:1]]
    parts += [DTYPE_NAMES[word] for word in re.findall(r"\w+", arguments) if word in DTYPE_NAMES]
    if len(numbers) > 1:
        parts.append("x".join(numbers[1:]))
    # The configurations' flags, in order: ForwardConfig's softcap, left window bound, varlen, CTA pairs and dealt tiles
    # (`<hd64,bf16,128x128,softcap>`, `<hd64,bf16,128x128,left-window,varlen>`), BackwardConfig's softcap and varlen,
    # and the split sum's varlen (`sum_dkv_splits_kernel<bf16,varlen>`).
    flags = re.findall(r"\b(true|false)\b", arguments)
    if "ForwardConfig" in arguments:
        flag_names = ("softcap", "left-window", "varlen", "paired", "dealt")
    elif "BackwardConfig" in arguments:
        flag_names = ("softcap", "varlen")
    else:
        flag_names = ("varlen",)
    parts += [name for name, flag in zip(flag_names, flags) if flag == "true"]
    return "{}<{}>".format(name.split("::")[-1], ",".join(parts))


def run(command, **options):
    return subprocess.run(command, capture_output=True, text=True, check=True, **options).stdout


def demangle(names):
    return dict(zip(names, run(["c++filt"], input="\n".join(names)).splitlines()))


def resource_usage(cuobjdump, cubin):
    """{mangled name: {"REG": n, "STACK": n, ...}} from `cuobjdump -res-usage`."""
    text = run([cuobjdump, "-res-usage", cubin])
    return {
        name: {key: int(value) for key, value in re.findall(r"([A-Z]+):(\d+)", fields)}
        for name, fields in re.findall(r"Function (\S+):\s*\n\s*(.*)", text)
    }


def extract_cubins(cuobjdump, path, directory):
    if path.endswith(".cubin"):
        return [path]
    result = subprocess.run(
        [cuobjdump, "-xelf", "all", os.path.abspath(path)], cwd=directory, capture_output=True, text=True
    )
    if result.returncode != 0:
        print(f"sass_report: {path}: skipped ({result.stderr.strip()})", file=sys.stderr)
    return sorted(str(p) for p in pathlib.Path(directory).glob("*.cubin"))


def kernel_row(file, name, usage, instructions):
    """The report row of one kernel: FIELDS, plus its loops under "loops"."""
    loops = find_loops(instructions)
    step = find_step_loop(loops)
    setmaxnreg = sorted(
        {
            int(value.group(1), 16)
            for ins in instructions
            if ins.opcode.startswith("USETMAXREG")
            for value in [SETMAXNREG_RE.search(ins.operands)]
            if value
        }
    )
    row = {
        "file": file,
        "kernel": name,
        "registers": usage.get("REG", ""),
        "setmaxnreg": "/".join(map(str, setmaxnreg)),
        "stack_bytes": usage.get("STACK", ""),
        "kernel_instructions": len(instructions),
        "loop_range": step.address_range() if step else "",
        "loop_instructions": len(step.instructions) if step else "",
        "loop_path_min": step.path_min if step else "",
        "loop_path_max": step.path_max if step else "",
        "loops": loops,
    }
    for opcode, count in count_opcodes(instructions).items():
        row["kernel_" + opcode] = count
    for opcode, count in count_opcodes(step.instructions if step else []).items():
        row["loop_" + opcode] = count if step else ""
    return row


def analyze_file(cuobjdump, nvdisasm, path):
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for cubin in extract_cubins(cuobjdump, path, directory):
            kernels = parse_nvdisasm(run([nvdisasm, "-c", cubin]))
            usage = resource_usage(cuobjdump, cubin)
            names = demangle(list(kernels))
            for mangled, instructions in kernels.items():
                rows.append(
                    kernel_row(
                        os.path.basename(path),
                        short_kernel_name(names[mangled]),
                        usage.get(mangled, {}),
                        strip_padding(instructions),
                    )
                )
    return rows


def print_markdown(rows):
    print(
        "Counts are `step loop / whole kernel`, static (instructions in the code: both sides of a"
        " branch count). Step loop: the innermost loop with the most HGMMA (its address range);"
    )
    print(
        "step path: the fewest–most instructions through one iteration. Regs: registers at launch"
        " (setmaxnreg values of the warp roles). Stack: stack frame bytes."
    )
    print(
        "LDL / STL: local load / store instructions, i.e. spill reloads / spills (spill bytes are not"
        " in the cubin). Method and limits: scripts/sass_report.py."
    )
    print()
    header = ["kernel", "file", "regs", "stack", "step loop", "step path", "instrs"] + COUNTED_OPCODES
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] * 2 + ["--:"] * 2 + ["---"] + ["--:"] * (len(header) - 5)) + "|")
    for row in rows:
        has_loop = bool(row["loop_range"])
        cells = [
            row["kernel"],
            row["file"],
            "{} ({})".format(row["registers"], row["setmaxnreg"]) if row["setmaxnreg"] else str(row["registers"]),
            str(row["stack_bytes"]),
            row["loop_range"] or "none",
            "{}–{}".format(row["loop_path_min"], row["loop_path_max"]) if has_loop else "-",
        ]
        cells += [
            "{} / {}".format(row["loop_" + name] if has_loop else "-", row["kernel_" + name])
            for name in ["instructions"] + COUNTED_OPCODES
        ]
        print("| " + " | ".join(cells) + " |")


def print_loops(rows):
    print()
    print("Loops with HGMMA (depth 0 = outermost, `*` = the step loop):")
    print()
    print("| kernel | file | loop | depth | instrs | path | HGMMA |")
    print("|---|---|---|--:|--:|--:|--:|")
    for row in rows:
        for loop in row["loops"]:
            if loop.hgmma:
                mark = " *" if loop.address_range() == row["loop_range"] else ""
                print(
                    "| %s | %s | %s%s | %d | %d | %d–%d | %d |"
                    % (
                        row["kernel"],
                        row["file"],
                        loop.address_range(),
                        mark,
                        loop.depth,
                        len(loop.instructions),
                        loop.path_min,
                        loop.path_max,
                        loop.hgmma,
                    )
                )


def default_objects():
    directory, pattern = DEFAULT_OBJECT_PATTERN
    return sorted(str(p) for p in (REPOSITORY / directory).rglob(pattern))


def report(arguments):
    files = arguments.files or default_objects()
    if not files:
        sys.exit(
            f"sass_report: no {DEFAULT_OBJECT_PATTERN[1]} under {REPOSITORY / DEFAULT_OBJECT_PATTERN[0]}; "
            "build first (scripts/bootstrap.sh)"
        )
    rows = [row for path in files for row in analyze_file(arguments.cuobjdump, arguments.nvdisasm, path)]
    if not rows:
        sys.exit("sass_report: no kernels in " + " ".join(files))
    print_markdown(rows)
    if arguments.loops:
        print_loops(rows)
    if arguments.csv:
        with open(arguments.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)


def read_rows_by_kernel(path):
    """{key: row}; the key is the kernel name, plus the file where the name repeats (and `#n`)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    names = [r["kernel"] for r in rows]
    keyed = {}
    for row in rows:
        key = row["kernel"] + (" ({})".format(row["file"]) if names.count(row["kernel"]) > 1 else "")
        number = 2
        unique = key
        while unique in keyed:
            unique, number = "%s #%d" % (key, number), number + 1
        keyed[unique] = row
    return keyed


def diff(old_path, new_path):
    """One Markdown row per kernel that changed, was added or removed; then the unchanged ones."""
    old, new = read_rows_by_kernel(old_path), read_rows_by_kernel(new_path)
    unchanged = []
    print("| kernel | changes (old → new) |")
    print("|---|---|")
    for key in list(old) + [k for k in new if k not in old]:
        if key not in old or key not in new:
            print("| {} | {} |".format(key, "added" if key not in old else "removed"))
            continue
        changes = []
        for field in FIELDS:
            before, after = old[key].get(field, ""), new[key].get(field, "")
            if field in FIELDS_NOT_DIFFED or before == after:
                continue
            change = "{} {} → {}".format(field, before or "-", after or "-")
            if before.isdigit() and after.isdigit():
                change += " (%+d)" % (int(after) - int(before))
            changes.append(change)
        if changes:
            print("| {} | {} |".format(key, ", ".join(changes)))
        else:
            unchanged.append(key)
    print()
    print("Unchanged: " + (", ".join(unchanged) or "none"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--diff", nargs=2, metavar=("OLD_CSV", "NEW_CSV"))
    parser.add_argument("--cuobjdump")
    parser.add_argument("--nvdisasm")
    parser.add_argument("--csv", metavar="FILE")
    parser.add_argument("--loops", action="store_true")
    parser.add_argument("files", nargs="*")
    arguments = parser.parse_args()
    if arguments.diff:
        diff(*arguments.diff)
    elif not (arguments.cuobjdump and arguments.nvdisasm):
        parser.error("--cuobjdump and --nvdisasm are needed for a report")
    else:
        report(arguments)


if __name__ == "__main__":
    main()
