"""The layering rule and the absence of import circles, read from the source.

Arrows point ``codegen -> simplify -> texpr``, never back, and no modules import
each other in a circle, with no import moved into a function to hide one.

What is read. Every ``.py`` file under ``texpr/`` (the modules ``texpr.*``),
``simplify/`` (installed as ``texpr.simplify.*``) and ``codegen/`` (installed as
``texpr.codegen.*``) is parsed with :mod:`ast` (nothing is imported). Every
``import`` and ``from ... import`` statement counts, wherever it stands: at
module level, in a function or method, under an ``if``. So does
``importlib.import_module("name")`` / ``__import__("name")`` with a literal
name. A name computed at run time cannot be read: only the two lazy package
faces compute one (``texpr/__init__.py``'s ``__getattr__`` for ``te.simplify``,
``te.codegen``, ``te.torch``, ``te.jax``; ``simplify/__init__.py``'s for its
public names), and a test checks that no other file does. The ``texpr.simplify``
face's edges to the modules in its ``_EXPORTS`` table are counted (they are
internal to simplify); the ``texpr`` face's lazy subpackages are attribute
access for users, not imports of the package, and are not counted.

The layers.

* core: ``texpr.*`` except the user level below (the IR, evaluate,
  differentiate, ``te.nn``, the caches, ``texpr.jax_ffi``, which codegen reads
  its array layout from and which imports neither jax nor numba);
* ``texpr.simplify.*``;
* ``texpr.codegen.*``;
* user level: ``texpr.examples.*`` and the framework bridges ``texpr.bridge``,
  ``texpr.torch``, ``texpr.jax``. They build kernels for users the way a user's
  script does, so they may import codegen and simplify; nothing in the three
  layers below imports them.

Rules: core never imports codegen, and imports ``texpr.simplify`` only from
``texpr/differentiate.py`` (``te.differentiate`` hands the raw adjoints to the
simplifier; nothing in simplify imports it back). simplify never imports
codegen. No import cycle anywhere: not among the core and simplify modules,
not in codegen, not across the layers.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"texpr": "texpr", "simplify": "texpr.simplify", "codegen": "texpr.codegen"}
USER_LEVEL = ("texpr.examples", "texpr.bridge", "texpr.torch", "texpr.jax")
#: the one module of the core that imports texpr.simplify
SIMPLIFY_ENTRY = "texpr.differentiate"
#: the files whose lazy ``__getattr__`` computes a module name (and codegen's
#: aliases of the module paths it had before its pipeline layout)
LAZY_FACES = ("texpr", "texpr.simplify", "texpr.codegen._aliases",
              "texpr.codegen.backends.registered")
#: the module that finds the backends (each ``codegen/backends/<name>/backend.py``)
#: and imports them by computed names: its edges are those modules
BACKEND_FINDER = "texpr.codegen.backends.registered"



def _modules():
    """module name -> (path, is a package face)."""
    mods = {}
    for folder, pkg in PACKAGES.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if not f.endswith(".py"):
                    continue
                parts = os.path.relpath(os.path.join(dirpath, f), base)[:-3].split(os.sep)
                face = parts[-1] == "__init__"
                if face:
                    parts = parts[:-1]
                mods[".".join([pkg] + parts)] = (os.path.join(dirpath, f), face)
    return mods


MODULES = _modules()


def _known(name):
    """The longest prefix of ``name`` that is one of our modules, or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module, node):
    """The modules an import statement of ``module`` names (ours only)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            if not MODULES[module][1]:  # a plain module: relative to its package
                parts = parts[:-1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        # ``from P import m`` imports the module P.m when there is one, else names of P
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                 for a in node.names]
    return {t for t in map(_known, names) if t is not None}


def _dynamic_name(call):
    """``(True, literal or None)`` for ``importlib.import_module(...)`` and
    ``__import__(...)`` calls, ``(False, None)`` for any other call."""
    f = call.func
    is_import = ((isinstance(f, ast.Attribute) and f.attr == "import_module")
                 or (isinstance(f, ast.Name) and f.id in ("import_module", "__import__")))
    if not is_import:
        return False, None
    arg = call.args[0] if call.args else None
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return True, arg.value
    return True, None


def _face_exports(tree):
    """The ``_EXPORTS`` table of a lazy face: public name -> submodule name."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "_EXPORTS"):
            return ast.literal_eval(node.value)
    return {}


def _graph():
    """``(edges, computed)``: module -> the modules it imports; the modules that
    compute a module name at run time."""
    edges, computed = {}, set()
    for module, (path, _face) in MODULES.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets |= _targets(module, node)
            elif isinstance(node, ast.Call):
                dynamic, name = _dynamic_name(node)
                if dynamic and name is None:
                    computed.add(module)
                elif dynamic and _known(name):
                    targets.add(_known(name))
        if module == "texpr.simplify":
            targets |= {f"{module}.{sub}" for sub in _face_exports(tree).values()}
        if module == BACKEND_FINDER:  # the backends it finds and imports
            targets |= {m for m in MODULES if m.startswith("texpr.codegen.backends.")
                        and m.count(".") == 4 and m.endswith(".backend")}
        targets.discard(module)
        edges[module] = targets
    return edges, computed


EDGES, COMPUTED = _graph()


def _layer(module):
    if module.startswith("texpr.codegen"):
        return "codegen"
    if module.startswith("texpr.simplify"):
        return "simplify"
    if any(module == u or module.startswith(u + ".") for u in USER_LEVEL):
        return "user"
    return "core"


def _cycles(nodes):
    """The strongly connected components of more than one module among ``nodes``
    (Tarjan's algorithm, iterative), as sets."""
    nodes = set(nodes)
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(EDGES[root] & nodes)))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(EDGES[w] & nodes))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def _violations(rule):
    return sorted(f"{m} imports {t}" for m, ts in EDGES.items() for t in ts if rule(m, t))


def test_the_reader_sees_the_modules_and_their_imports():
    # the graph is not empty by accident: known modules and known edges are in it
    assert {"texpr", "texpr.expr", "texpr.tensor", "texpr.simplify.pipeline",
            "texpr.codegen.build", "texpr.examples.gpt"} <= set(MODULES)
    assert "texpr.expr" in EDGES["texpr.tensor"]
    assert "texpr.simplify" in EDGES[SIMPLIFY_ENTRY]
    assert "texpr.simplify.pipeline" in EDGES["texpr.simplify"]  # the face's _EXPORTS
    # a function-level import counts (simplify.entry imports the pipeline on a miss)
    assert "texpr.simplify.pipeline" in EDGES["texpr.simplify.entry"]
    # the backends the registry finds by their folders count as its imports
    assert "texpr.codegen.backends.numba_cpu.backend" in EDGES[BACKEND_FINDER]


def test_no_cycle_among_texpr_and_simplify_modules():
    nodes = [m for m in MODULES if _layer(m) in ("core", "simplify")]
    found = [sorted(c) for c in _cycles(nodes)]
    assert found == [], f"import cycles (function-level imports count): {found}"


def test_no_cycle_in_codegen():
    found = [sorted(c) for c in _cycles(m for m in MODULES if _layer(m) == "codegen")]
    assert found == [], f"codegen import cycles (function-level imports count): {found}"


def test_no_cycle_at_all():
    found = [sorted(c) for c in _cycles(MODULES)]
    assert found == [], f"import cycles across the layers: {found}"


def test_core_never_imports_codegen_and_imports_simplify_only_to_differentiate():
    assert _violations(lambda m, t: _layer(m) == "core" and _layer(t) == "codegen") == []
    assert _violations(lambda m, t: _layer(m) == "core" and _layer(t) == "simplify"
                       and m != SIMPLIFY_ENTRY) == []


def test_simplify_never_imports_codegen():
    assert _violations(lambda m, t: _layer(m) == "simplify" and _layer(t) == "codegen") == []


def test_nothing_below_the_user_level_imports_it():
    assert _violations(lambda m, t: _layer(m) != "user" and _layer(t) == "user") == []


def test_only_the_lazy_package_faces_compute_a_module_name():
    assert sorted(COMPUTED) == sorted(LAZY_FACES)


def _external_imports(top):
    """module -> the top-level names of the outside packages it imports (at any depth)."""
    out = {}
    for name, (path, _) in _modules().items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        seen = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                seen.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                seen.add(node.module.split(".")[0])
        out[name] = seen & set(top)
    return out


def test_numba_is_imported_only_by_its_backend():
    # the loop-nest lowering writes through a dialect: no codegen module outside
    # backends/numba_cpu imports numba or llvmlite (issue 49)
    users = {m for m, ts in _external_imports({"numba", "llvmlite"}).items() if ts}
    outside = sorted(m for m in users if not m.startswith("texpr.codegen.backends.numba_cpu"))
    assert users and outside == []


def test_only_the_numba_backend_names_numba():
    # `git grep -l numba -- codegen` lists backends/numba_cpu/ only (issue 49): no other
    # codegen file names it, not even in a string or a comment (the old module paths
    # of codegen._aliases are found on disk, the retired constants and registrations
    # are in the backend's own backend.py)
    codegen = os.path.join(ROOT, "codegen")
    own = os.path.join(codegen, "backends", "numba_cpu")
    named = []
    for folder, _dirs, files in os.walk(codegen):
        if folder.startswith(own) or "__pycache__" in folder:
            continue
        for f in files:
            path = os.path.join(folder, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                if "numba" in fh.read():
                    named.append(os.path.relpath(path, ROOT))
    assert named == []


def test_islpy_is_imported_only_by_the_isl_bridge():
    users = sorted(m for m, ts in _external_imports({"islpy"}).items() if ts)
    assert users == ["texpr.simplify.isl_bridge"]
