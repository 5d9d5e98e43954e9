"""The import graph of macbatch, read from the source with ``ast``: no module imports itself
through others (a cycle makes import order matter and hides a layer pointing up), imports point
down the layers (front ends -> the request layer -> the engine -> the kernels), nothing outside
the engine imports a module inside it (only the names ``macbatch.engine`` exports), and the
distributed follower runs the forward without the engine core (docs/distributed.md).

Every import counts, at any level (inside functions and ``TYPE_CHECKING`` blocks too): an import
that only runs later still ties the two modules together. ``from package import name`` is an
edge to ``package.name`` when that is a module, else to the package. Importing a submodule runs
its package's ``__init__``, but that is not counted as an edge: otherwise every package whose
``__init__`` re-exports its submodules would be a cycle with each of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "macbatch"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The macbatch modules ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                child = f"{origin}.{alias.name}"
                found.add(child if child in modules else origin)
    return {_owning_module(m, modules) for m in found if m.split(".")[0] == PACKAGE} - {None}


def _owning_module(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or the closest package above it that exists (``import a.b.c`` names a.b.c)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) - {name} for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(component, graph) for component in components]


def _cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle from the component's first module back to it, for the message."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return component


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` imports, directly or not, each with the module that imports it."""
    seen = {start: ""}
    frontier = [start]
    while frontier:
        node = frontier.pop()
        for nxt in sorted(graph.get(node, ())):
            if nxt not in seen:
                seen[nxt] = node
                frontier.append(nxt)
    return seen


def test_the_graph_is_read() -> None:
    """A sanity check on the reader itself, on edges known to exist."""
    graph = import_graph()
    assert "macbatch.engine.engine" in graph["macbatch.engine"]  # from macbatch.engine.engine ...
    assert "macbatch.engine.stores.pages" in graph["macbatch.engine.model.adapter"]
    assert (
        "macbatch.engine.distributed.follower" in graph["macbatch.commands.launch"]
    )  # in a function


# Cycles known and being removed elsewhere (the TUI's service split, issue 30): each entry is a
# cycle's modules. The test fails on any other cycle, and on an entry that no longer is one, so
# this list only shrinks.
KNOWN_CYCLES: list[set[str]] = []


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_graph())
    new = [c for c in cycles if set(c) not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(" -> ".join(c) for c in new)
    gone = [k for k in KNOWN_CYCLES if k not in [set(c) for c in cycles]]
    assert not gone, f"no longer cycles, remove them from KNOWN_CYCLES: {gone}"


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]


# The layers, top down (docs/architecture.md, "Layers"), each as the modules it holds (a
# prefix holds its package's modules): a module imports nothing in a layer above its own. Every
# module is in one, so a new top-level module must be placed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "front ends",
        (
            "macbatch.tui",
            "macbatch.batch",
            "macbatch.server",
            "macbatch.commands",
            "macbatch.models",
            "macbatch.session_settings",
            "macbatch.cli",
            "macbatch.__main__",
        ),
    ),
    ("request layer", ("macbatch.openai",)),
    ("engine", ("macbatch.engine",)),
    ("kernels", ("macbatch.metal",)),
    # below them all: the demo models (the engine's loader resolves "demo" and builds
    # "demo-vision"), the data directory and the machine's paths, the BLAS the command line
    # preloads, ceiling division, and the package's own facts
    (
        "leaves",
        ("macbatch.demo", "macbatch.config", "macbatch.blas", "macbatch.arithmetic", PACKAGE),
    ),
]

ENGINE = "macbatch.engine"
# The imports of engine modules from outside the engine, each with why: the launcher joins the
# group and runs the follower's loop before any command, on ranks that never build an Engine.
PAST_THE_ENGINE_API: dict[str, set[str]] = {
    "macbatch.commands.launch": {
        "macbatch.engine.distributed.group",
        "macbatch.engine.distributed.channel",
        "macbatch.engine.distributed.follower",
    },
}


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of the layer holding ``module`` (the package itself holds only
    its ``__init__``, not every module under it)."""
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != PACKAGE and module.startswith(prefix + ".")):
                return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module in a layer above the importer's."""
    return [
        f"{module} ({LAYERS[layer_of(module)][0]}) -> {imported} ({LAYERS[layer_of(imported)][0]})"
        for module, imports in sorted(graph.items())
        for imported in sorted(imports)
        if layer_of(imported) < layer_of(module)
    ]


def imports_past_the_engine_api(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module inside the engine by a module outside it, but those allowed."""
    inside = ENGINE + "."
    return [
        f"{module} -> {imported}"
        for module, imports in sorted(graph.items())
        if module != ENGINE and not module.startswith(inside)
        for imported in sorted(imports)
        if imported.startswith(inside) and imported not in PAST_THE_ENGINE_API.get(module, set())
    ]


def test_imports_point_down_the_layers() -> None:
    found = upward_imports(import_graph())
    assert not found, "imports up the layers:\n" + "\n".join(found)


def test_only_the_engine_imports_its_modules() -> None:
    found = imports_past_the_engine_api(import_graph())
    assert not found, (
        "import engine names from macbatch.engine (export them there), not its modules:\n"
        + "\n".join(found)
    )
    graph = import_graph()
    for module, allowed in PAST_THE_ENGINE_API.items():
        assert allowed <= graph[module], f"{module} no longer imports all of {allowed}: shrink it"


def test_the_layer_rules_catch_a_violation() -> None:
    """The rules on graphs with one wrong edge each: they must be able to fail."""
    assert upward_imports({"macbatch.metal.kernels": {"macbatch.engine.engine"}}) == [
        "macbatch.metal.kernels (kernels) -> macbatch.engine.engine (engine)"
    ]
    assert upward_imports({"macbatch.engine.runtime": {"macbatch.openai.requests"}})
    assert upward_imports({"macbatch.openai.requests": {"macbatch.server.app"}})
    assert upward_imports({"macbatch.demo.vision": {"macbatch.engine"}})
    assert not upward_imports({"macbatch.server.app": {"macbatch.engine", "macbatch.metal"}})
    assert imports_past_the_engine_api({"macbatch.tui.app": {"macbatch.engine.engine"}}) == [
        "macbatch.tui.app -> macbatch.engine.engine"
    ]
    assert imports_past_the_engine_api({"macbatch.commands.launch": {"macbatch.engine.runtime"}})
    assert not imports_past_the_engine_api({"macbatch.engine.engine": {"macbatch.engine.config"}})
    assert not imports_past_the_engine_api({"macbatch.tui.app": {"macbatch.engine"}})


def test_the_follower_does_not_import_the_engine_core() -> None:
    graph = import_graph()
    seen = reachable(graph, "macbatch.engine.distributed.follower")
    chain = ["macbatch.engine.engine"]
    while chain[-1] in seen and seen[chain[-1]]:
        chain.append(seen[chain[-1]])
    assert len(chain) == 1, "the follower imports the engine core: " + " <- ".join(chain)


# The engine's folders top down, each with the folders it may import (docs/architecture.md,
# "Layers", lists them in this order): one way only, so the table is a DAG (tested below) and
# a folder's modules never wait on a folder above. The engine's top-level modules
# (``engine.py``, ``runtime.py``, ``config.py``, ``tokenizer.py`` ...) are not folders: the
# rule leaves them to the cycle test. A new folder must be placed here.
ENGINE_FOLDERS: dict[str, set[str]] = {
    "distributed": {
        "worker",
        "speculative",
        "inputs",
        "core",
        "model",
        "parsers",
        "pooling",
        "sample",
        "stores",
    },
    "worker": {
        "speculative",
        "core",
        "kv",
        "lora",
        "multimodal",
        "model",
        "pooling",
        "sample",
        "structured_output",
        "stores",
    },
    "speculative": {"core", "kv", "model", "parsers", "sample", "structured_output", "stores"},
    "encoder": {"inputs", "core", "model", "multimodal", "pooling", "sample"},
    "inputs": {"core", "multimodal", "parsers", "pooling", "sample", "structured_output"},
    "core": {"kv", "model", "multimodal", "parsers", "pooling", "sample", "structured_output"},
    "kv": {"model", "stores"},
    "multimodal": {"model"},
    "model": {"stores"},
    "lora": set(),
    "sample": {"structured_output"},
    "structured_output": {"parsers"},
    "parsers": set(),
    "pooling": set(),
    "stores": set(),
}


def engine_folder(module: str) -> str | None:
    """The engine folder holding ``module`` (None: outside the engine, or a top-level module)."""
    parts = module.split(".")
    if parts[:2] != [PACKAGE, "engine"] or len(parts) < 4:
        return None
    return parts[2]


def folder_imports_not_allowed(graph: dict[str, set[str]]) -> list[str]:
    """Every import from one engine folder to another that ``ENGINE_FOLDERS`` does not allow."""
    found = []
    for module, imports in sorted(graph.items()):
        folder = engine_folder(module)
        if folder is None:
            continue
        for imported in sorted(imports):
            other = engine_folder(imported)
            if other is not None and other != folder and other not in ENGINE_FOLDERS[folder]:
                found.append(f"{folder} -> {other}: {module} -> {imported}")
    return found


def test_the_engine_folders_import_one_way() -> None:
    graph = import_graph()
    folders = {engine_folder(m) for m in graph} - {None}
    assert folders <= set(ENGINE_FOLDERS), (
        f"place {folders - set(ENGINE_FOLDERS)} in ENGINE_FOLDERS"
    )
    assert not find_cycles(ENGINE_FOLDERS), "ENGINE_FOLDERS must point one way"
    order = list(ENGINE_FOLDERS)  # top down, as docs/architecture.md's table lists them
    for index, folder in enumerate(order):
        above = ENGINE_FOLDERS[folder] & set(order[: index + 1])
        assert not above, f"{folder} may import {above}, listed above it: reorder"
    found = folder_imports_not_allowed(graph)
    assert not found, "imports between engine folders not in ENGINE_FOLDERS:\n" + "\n".join(found)


def test_the_folder_rule_catches_a_wrong_edge() -> None:
    """The rule on graphs with one wrong edge each: it must be able to fail."""
    assert folder_imports_not_allowed(
        {"macbatch.engine.kv.manager": {"macbatch.engine.worker.model_runner"}}
    ) == ["kv -> worker: macbatch.engine.kv.manager -> macbatch.engine.worker.model_runner"]
    assert folder_imports_not_allowed(
        {"macbatch.engine.model.adapter": {"macbatch.engine.core.packing"}}
    )
    assert not folder_imports_not_allowed(
        {"macbatch.engine.worker.model_runner": {"macbatch.engine.kv.group"}}
    )
    assert not folder_imports_not_allowed(  # top-level modules are not folders
        {"macbatch.engine.kv.elastic": {"macbatch.engine.config"}}
    )
    assert find_cycles({**ENGINE_FOLDERS, "stores": {"worker"}})
