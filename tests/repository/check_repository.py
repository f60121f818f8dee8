#!/usr/bin/env python3
"""Repository checks that run without a build or a GPU (CTest: repository_*).

1. Comments and documents state reasons that stay true: no work-period labels ("session", "fifteenth ...") in the
   source, scripts and documents, and no dates in code (documents may date a measurement). pytest's fixture scope
   (`scope="session"`) is the one allowed use of the word.
2. No document or binding states a C ABI version other than DASH_C_ABI_VERSION in src/capi/dash_c.h. A version
   number may appear in the documents only as history ("since ABI version 5"); Python's ABI_VERSION must match.
3. Python's view of the supported head dims and dtypes (python/dash_attn/_library.py: HEAD_DIMS, BACKWARD_HEAD_DIMS,
   DTYPE_NAMES) is the one list in cmake/Supported.cmake, from which CMake generates the C++ view.

    check_repository.py [--root DIR]    check the tree (exit 1 and one line per finding when it fails)
    check_repository.py --self-test     the negative control: planted labels, dates and version drift are found
"""

import argparse
import pathlib
import re
import sys

# Trees and files scanned (relative to the repository root). python/tests is left out: pytest's "session" is its
# own vocabulary there.
SCANNED = [
    "src",
    "include",
    "tools",
    "tests",
    "scripts",
    "docs",
    "python/dash_attn",
    "python/benchmarks",
    "cmake",
    "CMakeLists.txt",
    "README.md",
    "python/README.md",
    "CONTRIBUTING.md",
]
TEXT_SUFFIXES = {".h", ".hpp", ".cpp", ".cu", ".cuh", ".c", ".py", ".sh", ".cmake", ".txt", ".md", ".in", ".toml"}
THIS_FILE = pathlib.PurePosixPath("tests/repository/check_repository.py")

# Ordinals of eleven and above have no use in these files but as labels; lower ones ("a fifth of", "the fourth
# argument") do, and are caught where they label something by the noun that follows.
LABEL = re.compile(
    r"\bsessions?\b|\bwork[- ]periods?\b"
    r"|\b(?:eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth)\b"
    r"|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)[- ](?:period|round of work)\b",
    re.IGNORECASE,
)
FIXTURE_SCOPE = re.compile(r"""scope\s*=\s*["']session["']""")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# "C ABI (version 8", "ABI version 8", "C ABI (`dash_c.h`, version 8": a stated version; "since"/"from"/"until"/
# "before"/"up to" in front of it make it history. A period inside a word (dash_c.h) does not end the sentence.
ABI_MENTION = re.compile(r"\bABI\b(?:[^.\n]|\.(?=\w)){0,60}?\bversion\s+(\d+)", re.IGNORECASE)
HISTORY_WORDS = re.compile(
    r"\b(?:since|from|until|before|up to|through)\s+(?:C\s+)?(?:ABI\s+)?version\s+\d+$", re.IGNORECASE
)
CMAKE_LIST = re.compile(r"^set\((DASH_SUPPORTED_\w+) ([^)]*)\)$", re.MULTILINE)
PYTHON_TUPLE = re.compile(r"^(HEAD_DIMS|BACKWARD_HEAD_DIMS) = \(([^)]*)\)$", re.MULTILINE)
PYTHON_DTYPE_NAMES = re.compile(r"^DTYPE_NAMES = \{([^}]*)\}$", re.MULTILINE)
HEADER_VERSION = re.compile(r"^#define DASH_C_ABI_VERSION (\d+)$", re.MULTILINE)
PYTHON_VERSION = re.compile(r"^ABI_VERSION = (\d+)$", re.MULTILINE)


def label_findings(path, text):
    """(line, message) for each work-period label, and for each date in a file that is not a document."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in LABEL.finditer(FIXTURE_SCOPE.sub("", line)):
            found.append((number, f"work-period label '{match.group(0)}': state the reason instead"))
        if path.suffix != ".md":
            for match in DATE.finditer(line):
                found.append((number, f"date '{match.group(0)}' in code: cite docs/HISTORY.md instead"))
    return found


def abi_findings(text, version):
    """(line, message) for each stated C ABI version that is not `version` and not history."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in ABI_MENTION.finditer(line):
            stated = int(match.group(1))
            if stated != version and not HISTORY_WORDS.search(line[: match.end()]):
                found.append((number, f"states C ABI version {stated}, dash_c.h has {version}"))
    return found


def list_findings(cmake_text, python_text):
    """Messages for each way Python's lists differ from cmake/Supported.cmake's."""
    lists = {name: values.split() for name, values in CMAKE_LIST.findall(cmake_text)}
    head_dims = [int(value) for value in lists.get("DASH_SUPPORTED_HEAD_DIMS", [])]
    dtypes = lists.get("DASH_SUPPORTED_DTYPES", [])
    if not head_dims or not dtypes:
        return ["cmake/Supported.cmake: no DASH_SUPPORTED_HEAD_DIMS or DASH_SUPPORTED_DTYPES list"]
    found = []
    tuples = {
        name: [int(value) for value in values.replace(",", " ").split()]
        for name, values in PYTHON_TUPLE.findall(python_text)
    }
    if tuples.get("HEAD_DIMS") != head_dims:
        found.append(f"HEAD_DIMS = {tuples.get('HEAD_DIMS')}, cmake/Supported.cmake has {head_dims}")
    if not set(tuples.get("BACKWARD_HEAD_DIMS", [])) <= set(head_dims):
        found.append(f"BACKWARD_HEAD_DIMS = {tuples.get('BACKWARD_HEAD_DIMS')} is not within {head_dims}")
    names = PYTHON_DTYPE_NAMES.search(python_text)
    python_dtypes = re.findall(r'"(\w+)"', names.group(1)) if names else []
    if python_dtypes != dtypes:
        found.append(f"DTYPE_NAMES names {python_dtypes}, cmake/Supported.cmake has {dtypes}")
    return found


def scanned_files(root):
    for entry in SCANNED:
        path = root / entry
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for candidate in candidates:
            relative = pathlib.PurePosixPath(candidate.relative_to(root).as_posix())
            if relative == THIS_FILE or candidate.suffix not in TEXT_SUFFIXES:
                continue
            yield relative, candidate


def check(root):
    problems = []
    header = (root / "src/capi/dash_c.h").read_text()
    version_match = HEADER_VERSION.search(header)
    if not version_match:
        return ["src/capi/dash_c.h: no '#define DASH_C_ABI_VERSION N' line"]
    version = int(version_match.group(1))
    for relative, path in scanned_files(root):
        text = path.read_text(errors="replace")
        for number, message in label_findings(relative, text):
            problems.append(f"{relative}:{number}: {message}")
        if relative.suffix == ".md":
            for number, message in abi_findings(text, version):
                problems.append(f"{relative}:{number}: {message}")
    binding = root / "python/dash_attn/_library.py"
    if binding.is_file():
        python_match = PYTHON_VERSION.search(binding.read_text())
        if python_match and int(python_match.group(1)) != version:
            problems.append(
                f"python/dash_attn/_library.py: ABI_VERSION = {python_match.group(1)}, dash_c.h has {version}"
            )
        lists = root / "cmake/Supported.cmake"
        if not lists.is_file():
            problems.append("cmake/Supported.cmake: missing (the one list of head dims and dtypes)")
        else:
            for message in list_findings(lists.read_text(), binding.read_text()):
                problems.append(f"python/dash_attn/_library.py: {message}")
    return problems


def self_test():
    """Each planted problem is found and each allowed form is not; returns the failures."""
    failures = []
    md, code = pathlib.PurePosixPath("docs/X.md"), pathlib.PurePosixPath("src/x.hpp")
    must_find = [
        (code, "// 1.06x (fifteenth session)"),
        (code, "// measured 2026-12-02"),
        (md, "In the Session 17 run"),
        (md, "the seventeenth ..."),
        (code, "# a work period's result"),
    ]
    must_pass = [
        (code, '@pytest.fixture(scope="session")'),
        (code, "// a fifth of the time, the fourth argument"),
        (md, "measured on 2026-12-04 at 3039be2"),
        (code, "// on the first call"),
    ]
    for path, line in must_find:
        if not label_findings(path, line):
            failures.append(f"label not found in {path}: {line!r}")
    for path, line in must_pass:
        if label_findings(path, line):
            failures.append(f"false label in {path}: {line!r}")
    drift = ["The C ABI (version 8) carries", "the C ABI (`src/capi/dash_c.h`, version 8: ...", "ABI version 11"]
    fine = [
        "The C ABI (version 9) carries",
        "dash_shape gains the fields (since ABI version 5)",
        "The C ABI (src/capi/dash_c.h; its version is DASH_C_ABI_VERSION)",
    ]
    for line in drift:
        if not abi_findings(line, 9):
            failures.append(f"version drift not found: {line!r}")
    for line in fine:
        if abi_findings(line, 9):
            failures.append(f"false version drift: {line!r}")
    cmake = "set(DASH_SUPPORTED_HEAD_DIMS 64 128)\nset(DASH_SUPPORTED_DTYPES bf16 fp16)\n"
    python = 'HEAD_DIMS = (64, 128)\nBACKWARD_HEAD_DIMS = (64, 128)\nDTYPE_NAMES = {0: "bf16", 1: "fp16"}\n'
    if list_findings(cmake, python):
        failures.append(f"false list drift: {list_findings(cmake, python)}")
    for drifted in (
        python.replace("(64, 128)\nB", "(64, 96, 128)\nB"),
        python.replace('"fp16"', '"fp8"'),
        python.replace("BACKWARD_HEAD_DIMS = (64, 128)", "BACKWARD_HEAD_DIMS = (64, 256)"),
    ):
        if not list_findings(cmake, drifted):
            failures.append(f"list drift not found: {drifted!r}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[2])
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    problems = self_test() if args.self_test else check(args.root)
    for problem in problems:
        print(problem)
    if not problems:
        print("self-test passed" if args.self_test else f"{args.root}: no labels, dates in code, ABI or list drift")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
