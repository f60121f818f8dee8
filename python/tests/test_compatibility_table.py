"""The compatibility table of python/README.md ("Compatibility with FlashAttention and SDPA"), checked against the
package, so the table cannot drift from the code: every row's DASH function exists and takes exactly the listed
parameters positionally, in order (DASH's extras keyword-only), deterministic (where it has one) defaults to True;
every listed refusal raises NotImplementedError naming the argument, before any device work; a function marked
missing is absent from dash_attn and dash_attn.fa3; and every FlashAttention-style function the package exports has a
row. The parser itself is checked on a broken table (it must fail).
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

import dash_attn  # noqa: E402
from dash_attn import fa3  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Compatibility with FlashAttention and SDPA"
MISSING = "missing"


@dataclass
class Row:
    library: str
    function: str
    dash: str
    parameters: list[str]
    refused: list[str]


def _cell_names(cell: str) -> list[str]:
    return [name.strip() for name in cell.strip().strip("`").split(",") if name.strip()]


def parse_table(text: str) -> list[Row]:
    """The rows of the compatibility section's table; ValueError for a section or row that is not as expected."""
    if SECTION not in text:
        raise ValueError(f"README.md has no section {SECTION!r}")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    if header != ["library", "function", "DASH", "parameters", "refused"]:
        raise ValueError(f"unexpected table header {header}")
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5:
            raise ValueError(f"a row needs 5 cells: {line}")
        library, function, dash, parameters, refused = cells
        rows.append(Row(library, function.strip("`"), dash.strip("`"), _cell_names(parameters), _cell_names(refused)))
    return rows


ROWS = parse_table(README.read_text())


def resolve(dotted: str) -> object:
    module_name, _, attribute = dotted.rpartition(".")
    return getattr(importlib.import_module(module_name), attribute)


# For each refusable argument, a value that asks for something DASH does not compute.
PROBES = {
    "dropout_p": 0.1,
    "alibi_slopes": torch.ones(4),
    "block_table": torch.zeros(2, 1, dtype=torch.int32),
    "seqused_q": torch.ones(2, dtype=torch.int32),
    "seqused_k": torch.ones(2, dtype=torch.int32),
    "qv": torch.zeros(2, 4, 4, 64, dtype=torch.bfloat16),
    "q_descale": torch.ones(2, 2),
    "k_descale": torch.ones(2, 2),
    "v_descale": torch.ones(2, 2),
    "attention_chunk": 64,
    "num_splits": 4,
    "attn_mask": torch.ones(8, 8, dtype=torch.bool),
}


def tensor_arguments(parameters: list[str]) -> dict[str, object]:
    """Valid CPU stand-ins for a row's leading tensor and offset arguments (refusals come before device checks)."""
    bf16 = {"dtype": torch.bfloat16}
    shapes = {
        "q": (2, 8, 4, 64),
        "k": (2, 8, 2, 64),
        "v": (2, 8, 2, 64),
        "kv": (2, 8, 2, 2, 64),
        "qkv": (2, 8, 3, 4, 64),
        "query": (2, 4, 8, 64),
        "key": (2, 4, 8, 64),
        "value": (2, 4, 8, 64),
    }
    varlen = "cu_seqlens_q" in parameters or "cu_seqlens" in parameters
    if varlen:
        shapes.update(
            {"q": (16, 4, 64), "k": (16, 2, 64), "v": (16, 2, 64), "kv": (16, 2, 2, 64), "qkv": (16, 3, 4, 64)}
        )
    arguments = {name: torch.zeros(shape, **bf16) for name, shape in shapes.items() if name in parameters}
    for name in ("cu_seqlens_q", "cu_seqlens_k", "cu_seqlens"):
        if name in parameters:
            arguments[name] = torch.tensor([0, 8, 16], dtype=torch.int32)
    for name in ("max_seqlen_q", "max_seqlen_k", "max_seqlen"):
        if name in parameters:
            arguments[name] = 8
    return arguments


def test_the_table_has_every_function_of_both_libraries():
    listed = {(row.library, row.function) for row in ROWS}
    fa2 = [
        "flash_attn_func",
        "flash_attn_kvpacked_func",
        "flash_attn_qkvpacked_func",
        "flash_attn_varlen_func",
        "flash_attn_varlen_kvpacked_func",
        "flash_attn_varlen_qkvpacked_func",
        "flash_attn_with_kvcache",
        "bert_padding.unpad_input",
        "bert_padding.pad_input",
    ]
    fa3_functions = [
        "flash_attn_func",
        "flash_attn_qkvpacked_func",
        "flash_attn_varlen_func",
        "flash_attn_with_kvcache",
        "flash_attn_combine",
        "get_scheduler_metadata",
    ]
    expected = {("FA2", f) for f in fa2} | {("FA3", f) for f in fa3_functions}
    assert expected <= listed, f"missing rows: {sorted(expected - listed)}"


def test_every_exported_flashattention_function_has_a_row():
    dash_names = {row.dash for row in ROWS}
    exported = [f"dash_attn.{name}" for name in dash_attn.__all__ if name.startswith("flash_attn")]
    exported += [
        f"dash_attn.fa3.{name}"
        for name, value in vars(fa3).items()
        if name.startswith("flash_attn") and inspect.isfunction(value) and value.__module__ == fa3.__name__
    ]
    assert set(exported) <= dash_names, f"no row for {sorted(set(exported) - dash_names)}"


@pytest.mark.parametrize(
    "row", [r for r in ROWS if r.dash != MISSING and r.parameters], ids=lambda r: f"{r.library}.{r.function}"
)
def test_a_listed_function_takes_the_listed_parameters_in_order(row: Row):
    function = resolve(row.dash)
    parameters = inspect.signature(function).parameters.values()
    positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == row.parameters
    others = [p for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in others)
    if "deterministic" in inspect.signature(function).parameters:
        assert inspect.signature(function).parameters["deterministic"].default is True


@pytest.mark.parametrize(
    "case", [(r, name) for r in ROWS for name in r.refused], ids=lambda c: f"{c[0].library}.{c[0].function}:{c[1]}"
)
def test_a_listed_refusal_raises_naming_the_argument(case):
    row, name = case
    assert name in row.parameters, f"{name} is refused but not a parameter of {row.function}"
    assert name in PROBES, f"no probe value for {name}"
    arguments = {**tensor_arguments(row.parameters), name: PROBES[name]}
    with pytest.raises(NotImplementedError, match=rf"^{re.escape(name)}=.* is not supported"):
        resolve(row.dash)(**arguments)


@pytest.mark.parametrize("row", [r for r in ROWS if r.dash == MISSING], ids=lambda r: f"{r.library}.{r.function}")
def test_a_function_marked_missing_is_absent(row: Row):
    module = dash_attn if row.library == "FA2" else fa3
    assert not hasattr(module, row.function.rpartition(".")[2])


def test_the_sdpa_route_row_names_the_switch():
    row = next(r for r in ROWS if r.dash == "dash_attn.enable_sdpa")
    assert callable(resolve(row.dash)) and callable(dash_attn.disable_sdpa)


def test_the_parser_rejects_a_broken_table_and_a_wrong_order_fails():
    broken = f"{SECTION}\n\n| library | function | DASH |\n| --- | --- | --- |\n| FA2 | f | g |\n"
    with pytest.raises(ValueError, match="unexpected table header"):
        parse_table(broken)
    swapped = (
        f"{SECTION}\n\n| library | function | DASH | parameters | refused |\n| --- | --- | --- | --- | --- |\n"
        "| FA2 | `flash_attn_func` | `dash_attn.flash_attn_func` | `q, k, v, softmax_scale, dropout_p` | |\n"
    )
    (row,) = parse_table(swapped)
    with pytest.raises(AssertionError):
        test_a_listed_function_takes_the_listed_parameters_in_order(row)
