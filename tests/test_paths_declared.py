"""Each input path is declared once, and reports its figures through the stage contract.

A path's name, summary, order and advice live in its declaration
(`consumers/<path>/path.py`); each framework's half takes them from there.
Its stage figures are computed by profiler/telemetry.py from what the path
counted, the same for both frameworks, never by the path itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from core.registry import IDENTITY

ROOT = Path(__file__).resolve().parent.parent
# Where the halves and the declarations live; core/registry.py only gives the fields their defaults.
SOURCES = ("consumers", "feeders", "models", "harness", "profiler", "runner")
# What profiler/telemetry.py computes from a stage's counts: a path that builds these itself bypasses it.
FIGURE_KEYS = {"messages_per_sec", "bytes_per_sec", "latency_ms_mean", "recv_wait_ms_mean", "empty_share", "full_share"}


def source_files() -> list[Path]:
    return sorted(f for d in SOURCES for f in (ROOT / d).rglob("*.py"))


def declarations() -> dict[str, Path]:
    return {f.parent.name: f for f in sorted((ROOT / "consumers").glob("*/path.py"))}


def test_every_path_of_both_frameworks_takes_its_identity_from_one_declaration():
    code = (
        "import json\n"
        "from consumers import declared\n"
        "out = {}\n"
        "words = lambda paths, fw: [[n, d.words('summary', fw), d.order, d.in_default_run] for n, d in paths.items()]\n"
        "said = {fw: words(declared.of(fw), fw) for fw in ('tf', 'torch')}  # before any class is registered\n"
        "for fw in ('tf', 'torch'):\n"
        "    classes = declared.load(fw)\n"
        "    out[f'{fw} (declared)'] = [said[fw], words({n: c.declaration for n, c in classes.items()}, fw)]\n"
        "    for name, cls in classes.items():\n"
        "        d = cls.__dict__.get('declaration')\n"
        "        out[f'{fw} {name}'] = [cls.__module__, d and type(d).__module__, d and d.name,\n"
        "                              d and sys.modules[cls.__module__].PATH is d]\n"
        "print(json.dumps(out))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    import json

    paths = json.loads(p.stdout.strip().splitlines()[-1])
    for fw in ("tf", "torch"):  # what the CLI reads before the framework loads is what its classes say
        said, classes = paths.pop(f"{fw} (declared)")
        assert said == classes, fw
    assert len(paths) >= 15
    for key, (module, decl_module, decl_name, same) in paths.items():
        name = key.split(" ", 1)[1]
        assert decl_module == "core.registry", f"{key} ({module}) names no declaration"
        assert decl_name == name and same, f"{key}: its class and its declaration disagree"
    names = {k.split(" ", 1)[1] for k in paths}
    assert {n.replace("-", "_") for n in names} == set(declarations()), "a path without a declaration, or the reverse"


def test_no_class_outside_a_declaration_sets_a_paths_name_summary_or_advice():
    found = []
    for f in source_files():
        for cls in ast.walk(ast.parse(f.read_text())):
            if not isinstance(cls, ast.ClassDef) or not _is_path(cls):
                continue
            for st in cls.body:
                targets = (
                    st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) else []
                )
                for t in targets:
                    if isinstance(t, ast.Name) and t.id in IDENTITY:
                        found.append(f"{f.relative_to(ROOT)}:{st.lineno} {cls.name}.{t.id}")
    assert not found, "declared outside consumers/<path>/path.py:\n" + "\n".join(found)


def _is_path(cls: ast.ClassDef) -> bool:
    """A registered class, or one built on a path base (the bases' names end in InputPath, Pull or Fed)."""
    bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in cls.bases]
    registered = any(isinstance(d, ast.Name) and d.id == "register" for d in cls.decorator_list)
    return registered or any(b.endswith(("InputPath", "Pull", "Fed")) for b in bases)


def _strings(f: Path) -> set[str]:
    """The file's string constants, its docstrings left out."""
    tree = ast.parse(f.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef) and n.body and isinstance(n.body[0], ast.Expr)
    }
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    }


def test_a_paths_words_are_written_in_its_declaration_only():
    own = {f: _strings(f) for f in source_files()}
    repeated = []
    for pkg, decl in declarations().items():
        words = {w for w in _strings(decl) if len(w) > 24}  # summaries and advice, not short keys
        assert words, f"{decl.relative_to(ROOT)} declares no summary"
        for f, strings in own.items():
            if f != decl and (same := words & strings):
                repeated.append(f"{f.relative_to(ROOT)} repeats {pkg}'s {sorted(same)[0]!r}")
    assert not repeated, "\n".join(repeated)


def test_no_path_computes_its_stage_figures_itself():
    found = []
    for f in source_files():
        if f.relative_to(ROOT).parts[0] in ("profiler",):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)} & FIGURE_KEYS
                if keys:
                    found.append(f"{f.relative_to(ROOT)}:{node.lineno} builds {sorted(keys)}")
    assert not found, "stage figures belong to profiler/telemetry.py:\n" + "\n".join(found)


# The stage contract (core.registry.InputPath): raw state only. Any other method named for figures, or the
# per-path figure methods it replaced, would compute a stage's figures outside profiler.telemetry.stage_figures.
CONTRACT = {"counters", "sampled_stages", "producer_figures", "result_fields"}
REPLACED = {"measure_start", "measure_end", "stage_figures", "accounting"}
# profiler/telemetry.py's stage computations: a path reaches them only from a stage's `figures` or its
# `producer_figures`; a trainer only through `stage_figures`.
STAGE_FUNCTIONS = {"wire_figures", "queue_figures", "staging_figures", "delivered_figures", "stats_file_figures"}


def test_every_registered_path_of_both_frameworks_keeps_to_the_stage_contract():
    code = (
        "import json, inspect\n"
        "from consumers import declared\n"
        "from core import registry\n"
        "out = []\n"
        "for fw in ('tf', 'torch'):\n"
        "    for name, cls in declared.load(fw).items():\n"
        "        for k in cls.__mro__[:-1]:\n"
        "            if k is registry.InputPath:\n"
        "                break\n"
        "            out += [[fw, name, k.__qualname__, m] for m, v in vars(k).items() if inspect.isfunction(v)]\n"
        "print(json.dumps(out))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    import json

    methods = json.loads(p.stdout.strip().splitlines()[-1])
    assert {fw for fw, *_ in methods} == {"tf", "torch"}
    wrong = [
        f"{fw} {name}: {owner}.{m}"
        for fw, name, owner, m in methods
        if m in REPLACED or ("figures" in m and m not in CONTRACT)
    ]
    assert not wrong, "stage figures outside the contract (profiler.telemetry.stage_figures):\n" + "\n".join(wrong)


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """(called name, call) for every call of a plain name or an attribute."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            out.append((f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""), n))
    return out


def test_both_trainers_get_stage_figures_only_from_the_profiler():
    for trainer in ("harness/tf/telemetry.py", "harness/torch/run.py"):
        names = {name for name, _ in _calls(ast.parse((ROOT / trainer).read_text()))}
        assert "stage_figures" in names, f"{trainer} does not call profiler.telemetry.stage_figures"
    found = []
    for f in source_files():
        part = f.relative_to(ROOT).parts[0]
        if part == "profiler":
            continue
        tree = ast.parse(f.read_text())
        allowed = set()  # calls inside a stage's `figures` or a path's `producer_figures`
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name in ("figures", "producer_figures") and part != "harness":
                allowed |= {id(c) for _, c in _calls(fn)}
        for name, call in _calls(tree):
            if name in STAGE_FUNCTIONS and id(call) not in allowed:
                found.append(f"{f.relative_to(ROOT)}:{call.lineno} calls {name}")
    assert not found, "stage figures bypass profiler.telemetry.stage_figures:\n" + "\n".join(found)


BAD_FLAGS = [
    (["--recv-timeout", "-1"], "--recv-timeout: -1 must be a finite number above 0"),
    (["--framework", "torch", "--fake-location", "nope"], "argument --fake-location: invalid choice: 'nope'"),
    (["--fake-location", "spdl"], "invalid choice: 'spdl'"),  # a PyTorch-only path
    (["--framework", "torch", "--fake-location", "spdl"], "--fake-location spdl needs --data DIR"),
    (["--fake-location", "zmq-consume", "--producers", "0"], "--producers"),
]


def test_a_bad_flag_is_refused_before_either_framework_is_imported():
    """The choices and the shared checks come from the declarations: a mistake costs a moment, not an import."""
    code = (
        "import json, sys\n"
        "import bench_input\n"
        "code = bench_input.main(json.loads(sys.argv[1]))\n"
        "print(json.dumps([code, [m for m in ('tensorflow', 'torch', 'tensorpack') if m in sys.modules]]))\n"
    )
    import json

    for argv, words in BAD_FLAGS:
        p = subprocess.run(
            [sys.executable, "-c", code, json.dumps(argv)], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert p.returncode == 0, p.stderr[-2000:]
        rc, imported = json.loads(p.stdout.strip().splitlines()[-1])
        assert rc == 2 and words in p.stderr, (argv, p.stderr[-1000:])
        assert imported == [], (argv, imported)


def _registered_classes(half: Path) -> list[str]:
    """The classes a framework half registers (`@register`)."""
    tree = ast.parse(half.read_text())
    return [
        n.name
        for n in tree.body
        if isinstance(n, ast.ClassDef) and any(getattr(d, "id", None) == "register" for d in n.decorator_list)
    ]


def test_a_path_has_one_class_name_in_both_frameworks():
    """One name per meaning: a reader who knows zmq-consume's TensorFlow class finds its PyTorch one by name."""
    names = {}
    for pkg in declarations():
        halves = {fw: ROOT / "consumers" / pkg / f"{fw}.py" for fw in ("tf", "torch")}
        names[pkg] = {fw: _registered_classes(f) for fw, f in halves.items() if f.exists()}
    assert all(len(n) == 1 for per in names.values() for n in per.values()), names
    differ = {pkg: per for pkg, per in names.items() if len({n[0] for n in per.values()}) > 1}
    assert not differ, f"a path's halves register classes of different names: {differ}"


NUMBERS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


def test_the_readme_counts_the_default_run_and_the_paths_on_request_as_declared():
    """README's "five in the default run ...; the others on request: three for TensorFlow, four for PyTorch"."""
    import re

    from consumers import declared

    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(r"\((\w+) in the default run, the baseline among them; the others on request: (\w+) for "
                  r"TensorFlow, (\w+) for PyTorch\)", text)  # fmt: skip
    assert m, "README no longer says how many paths run by default"
    default, tf_more, torch_more = (NUMBERS[w] for w in m.groups())
    for fw, more in (("tf", tf_more), ("torch", torch_more)):
        run = declared.default_run(fw)
        assert len(run) == default and "gpu" in run, (fw, run)
        assert len(declared.names(fw)) - len(run) == more, (fw, declared.names(fw))
