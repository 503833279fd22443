"""The layout's promises: a framework-neutral core, no import cycles, the two ends of the wire apart."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEUTRAL = ("core", "wire", "producers", "consumers", "profiler", "runner", "harness", "benchmarks")
# Benchmarks of the TensorFlow op itself import TensorFlow by definition.
FRAMEWORK_BENCHMARKS = {"benchmarks.bench_op"}
# Checks that drive a framework's own code by design (a GPU self-check, a trainer's overhead), named here.
FRAMEWORK_AWARE: set[str] = set()
PACKAGES = (*NEUTRAL, "feeders", "frameworks", "models", "zmq_ops")
# The framework halves inside the neutral folders: each input path's `tf.py` and `torch.py`, what several
# halves of one framework share (consumers/tf_*.py, consumers/torch_*.py), and the two trainers (harness/tf/,
# harness/torch/), the harness's framework plugins. Everything else in NEUTRAL is framework-free.
TF_HALF = re.compile(r"^(consumers\.[a-z0-9_]+\.tf|consumers\.tf_[a-z0-9_]+|harness\.tf(\..+)?)$")
TORCH_HALF = re.compile(r"^(consumers\.[a-z0-9_]+\.torch|consumers\.torch_[a-z0-9_]+|harness\.torch(\..+)?)$")


def is_half(module: str) -> bool:
    return bool(TF_HALF.match(module) or TORCH_HALF.match(module))


def modules(packages, halves: bool = True) -> list[str]:
    out = []
    for pkg in packages:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            name = ".".join(parts)
            if halves or not is_half(name):
                out.append(name)
    return out


def test_the_neutral_packages_import_neither_tensorflow_nor_torch():
    names = [m for m in modules(NEUTRAL, halves=False) if m not in FRAMEWORK_BENCHMARKS and not m.endswith("__main__")]
    code = (
        "import importlib, sys\n"
        f"for m in {names!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'torch', 'tensorpack'})\n"
        "print(' '.join(bad))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "", f"a neutral module imports {p.stdout.strip()}"
    assert len(names) > 30


def imports_of(module: str) -> set[str]:
    """Project modules `module` imports anywhere in its file (inside functions too: a hidden cycle is a cycle)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    known = set(modules(PACKAGES)) | {"bench_input"}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` imports pkg.mod; `from pkg import name` imports pkg itself.
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names
            ]
        found |= {n for n in names if n in known and n != module}
    return found


def test_project_modules_import_each_other_without_cycles():
    graph = {m: imports_of(m) for m in [*modules(PACKAGES), "bench_input"]}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n) :] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_two_ends_of_the_wire_do_not_import_each_other():
    for a, b in (("consumers", "producers"), ("producers", "consumers")):
        for m in modules([a]):
            bad = [n for n in imports_of_any(m) if n == b or n.startswith(b + ".")]
            assert not bad, f"{m} imports {bad}"


def imports_of_any(module: str) -> set[str]:
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


FRAMEWORKS = ("tensorflow", "torch", "tensorpack")


def test_no_neutral_module_imports_a_framework_even_inside_a_function():
    """The harness drives both trainers through their plugins (loaded by name), never by importing them."""
    bad = []
    for m in modules(NEUTRAL, halves=False):
        if m in FRAMEWORK_BENCHMARKS or m in FRAMEWORK_AWARE:
            continue
        for n in imports_of_any(m):
            if any(n == f or n.startswith(f + ".") for f in FRAMEWORKS) or is_half(n):
                bad.append(f"{m} imports {n}")
    assert not bad, "\n".join(bad)


def test_the_framework_halves_are_where_the_layout_says():
    """Each path's halves sit beside its declaration; the trainers are the harness's plugins, not top-level."""
    halves = [m for m in modules(PACKAGES) if is_half(m)]
    assert "consumers.zmq_consume.tf" in halves and "consumers.zmq_consume.torch" in halves
    assert "harness.tf.plugin" in halves and "harness.torch.plugin" in halves
    assert not [d.name for d in ROOT.iterdir() if d.is_dir() and d.name.endswith("_trainer")], "a top-level trainer"
    for trainer in ("harness/tf", "harness/torch"):
        assert not (ROOT / trainer / "inputs").exists(), f"an input path under {trainer}"
        assert not (ROOT / trainer / "models").exists(), f"a model under {trainer}"
    for f in (ROOT / "harness").rglob("*.py"):  # a path is a registered InputPath; a model is an nn.Module/ModelDesc
        text = f.read_text()
        assert "@register" not in text and "(nn.Module)" not in text and "(ModelDesc)" not in text, f


def test_the_stages_below_the_harness_never_import_it():
    """Paths, feeders and models serve the trainers; a half that reached up into its trainer would tie them."""
    bad = []
    for m in modules(("consumers", "feeders", "models", "frameworks")):
        bad += [f"{m} imports {n}" for n in imports_of_any(m) if n == "harness" or n.startswith("harness.")]
    assert not bad, "\n".join(bad)


def test_a_tensorflow_half_never_imports_torch_nor_a_pytorch_half_tensorflow():
    bad = []
    for m in modules(PACKAGES):
        other = ("torch",) if TF_HALF.match(m) else ("tensorflow", "tensorpack") if TORCH_HALF.match(m) else ()
        for n in imports_of_any(m):
            if any(n == f or n.startswith(f + ".") for f in other):
                bad.append(f"{m} imports {n}")
            if (TF_HALF.match(m) and TORCH_HALF.match(n)) or (TORCH_HALF.match(m) and TF_HALF.match(n)):
                bad.append(f"{m} imports {n}")
    assert not bad, "\n".join(bad)


MAX_FUNCTION_LINES = 60


def test_no_function_outside_tests_is_longer_than_sixty_lines():
    """A long function is split into named steps that say why; nested functions count with their parent."""
    long = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT)
        if rel.parts[0] == "tests" or any(p.startswith(".") or p in ("build", "__pycache__") for p in rel.parts):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)
