"""The symbolic cache: results of differentiation, simplification and lowering, kept on disk.

A warm run does no symbolic work it has already done. Three calls go through
:func:`memo`: ``te.differentiate(..., simplify=True)`` (kind
``"differentiate"``), :func:`texpr.simplify.simplify_with_record` (so
``simplify``, ``explain`` and ``jvp`` too; kind ``"simplify"``) and codegen's
lowering of a scheduled graph to a ``Program`` (kind ``"lower"``, hooked in
``texpr.codegen.build``).

Key. :func:`canonical` writes a text of the input graph that determines the
result: every stage reachable from the roots in topological order with its
kind, name, shape, dtypes, tag, attrs, axes (names and domains) and body; each
distinct expression node once (a DAG, never expanded into a tree), variables
numbered by first appearance (with their names and domains), constants with
their type and exact ``repr``, custom reducers with their combiner. Names are
part of the key because they are part of the results (``d_X__Y``). The key
is the sha256 of that text, the call's own arguments (which tensors are the
inputs, the head, the parallel flag, a schedule's decisions), a format
number, the content of texpr's own source files (so an edited pass never
serves an old result) and the versions of Python, numpy, sympy, islpy and
numba. A graph the text cannot describe exactly (an unknown operation, an
attribute value of a type it does not know) is not cached.

Binding back. The result is pickled with ``persistent_id``: every operation,
tensor, variable and custom combiner of the caller's graph is written as its
position in the canonical walk, and loading binds it to the caller's live
object (the adjoints dict is keyed by the caller's tensors; loaded stages read
the caller's placeholders). Everything the call created is loaded as new
objects (variables get fresh identities, expression nodes re-intern). A result
nested deeper than pickle's recursion limit is written in the order
:mod:`texpr.pickle_order` arranges (plain objects first without their state,
then expressions children first, then the states), so it loads at any depth.

Integrity (as :mod:`texpr.codegen.backends.numba_cpu.compile` for kernels): an entry is
``MAGIC, key, sha256 of the payload, payload``, written atomically (a
temporary file, then ``os.replace``). An entry that is truncated, corrupt,
holds another key, fails to unpickle or to bind, or has the wrong type is
removed with one :class:`SymbolicCacheWarning` and the result recomputed. A
directory that cannot be used degrades to no cache, with one warning per
process. Nothing here raises: a failure of the cache means the work is done
again. Pickle runs code from the file it loads: the cache directory must be
as trusted as the code (numba's own cache has the same rule).

Environment: ``TEXPR_SYMBOLIC_CACHE=0`` turns the cache off; it is also
bypassed while ``TEXPR_PRINT_PASSES`` or ``TEXPR_VERIFY`` is set (their
output is the point of the run). The directory is ``symbolic/`` under the
kernel cache directory (:mod:`texpr.cache`), whose size bound covers it.
"""

import hashlib
import io
import os
import pickle
import re
import sys
import tempfile
import warnings

from . import cache as _cache
from .errors import TexprWarning
from .pickle_order import FlatPickling, is_flat, unflat
from .version import __version__

__all__ = ["SymbolicCacheWarning", "memo", "canonical", "enabled", "stats", "FORMAT"]

#: bumped when the entry format or the canonical text changes
FORMAT = 1
_MAGIC = b"TEXPR-SYMBOLIC-CACHE\n"
_WARNED = set()
_FINGERPRINT = []
#: counts of this process: hits, misses, stores, discarded (corrupt) entries, uncacheable calls
stats = {"hit": 0, "miss": 0, "store": 0, "discard": 0, "uncacheable": 0}


class SymbolicCacheWarning(TexprWarning):
    """The symbolic cache was repaired (a corrupt entry removed and its result
    recomputed) or could not be used (results are then recomputed every run)."""


class Uncacheable(Exception):
    """The canonical text cannot describe this graph exactly (the reason is the message)."""


def enabled():
    """Whether the symbolic cache is on (``TEXPR_SYMBOLIC_CACHE`` not ``0``/``off``;
    bypassed while ``TEXPR_PRINT_PASSES`` or ``TEXPR_VERIFY`` is set)."""
    if os.environ.get("TEXPR_SYMBOLIC_CACHE", "1").strip().lower() in ("0", "off", "false", "no"):
        return False
    for var in ("TEXPR_PRINT_PASSES", "TEXPR_VERIFY"):
        if os.environ.get(var, "") not in ("", "0"):
            return False
    return True


def _warn_once(tag, message):
    if tag in _WARNED:
        return
    _WARNED.add(tag)
    warnings.warn(message, SymbolicCacheWarning, stacklevel=4)


# ---- the canonical text --------------------------------------------------------------


class Canonical:
    """The canonical text of a graph and the caller's objects it numbered.

    Attributes: ``text`` (str), ``objects`` (list: the caller's operations,
    tensors, variables and custom combiners, the position of each is its
    persistent id), ``refs`` (``id(object) -> position``).
    """

    def __init__(self):
        self.lines = []
        self.objects = []
        self.refs = {}
        self._ops = {}
        self._nodes = {}
        self._vars = {}
        self._combiners = {}

    @property
    def text(self):
        return "\n".join(self.lines)

    def _own(self, obj):
        if id(obj) not in self.refs:
            self.refs[id(obj)] = len(self.objects)
            self.objects.append(obj)

    # -- values --------------------------------------------------------------
    def value(self, v):
        """The text of an attribute value (plain data, tensors of the graph, nodes)."""
        from .expr import Combiner, Expr, Var
        from .tensor import Tensor

        if v is None or isinstance(v, (bool, int, float, str, bytes)):
            return f"{type(v).__name__}:{v!r}"
        if isinstance(v, Tensor):
            return self.tensor(v)
        if isinstance(v, Var):
            return self.var(v)
        if isinstance(v, Expr):
            return self.expr(v)
        if isinstance(v, Combiner):
            return self.combiner(v)
        if isinstance(v, (tuple, list)):
            return f"{type(v).__name__}(" + ",".join(self.value(x) for x in v) + ")"
        if isinstance(v, dict):
            items = [(self.value(k), self.value(x)) for k, x in v.items()]
            return "dict(" + ",".join(f"{k}={x}" for k, x in sorted(items)) + ")"
        tname = f"{type(v).__module__}.{type(v).__qualname__}"
        if tname.startswith("numpy.") and getattr(v, "shape", None) == ():
            return f"{tname}:{v!r}"
        raise Uncacheable(f"a value of type {tname}")

    def position(self, op):
        """The position of operation ``op`` in the canonical walk (Uncacheable if absent)."""
        pos = self._ops.get(id(op))
        if pos is None:
            raise Uncacheable(f"operation {op.name} is not in the graph")
        return pos

    def tensor(self, t):
        pos = self._ops.get(id(t.op))
        if pos is None:
            raise Uncacheable(f"tensor {t.name} is not in the graph")
        return f"T{pos}.{t.value_index}"

    def var(self, v):
        from .expr import IterVar

        n = self._vars.get(id(v))
        if n is None:
            n = self._vars[id(v)] = f"v{len(self._vars)}"
            self._own(v)
            extra = f",{v.dom},{v.kind}" if isinstance(v, IterVar) else ""
            self.lines.append(f"{n}={type(v).__name__}({v.name!r},{v.dtype}{extra})")
        return n

    def combiner(self, c):
        if c.kind != "custom":
            return f"builtin:{c.kind}:{c.name}:{','.join(c.dtypes)}"
        n = self._combiners.get(id(c))
        if n is None:
            self._own(c)
            lhs = [self.var(v) for v in c.lhs]
            rhs = [self.var(v) for v in c.rhs]
            res = [self.expr(e) for e in c.result]
            ident = [self.expr(e) for e in c.identity]
            n = self._combiners[id(c)] = f"c{len(self._combiners)}"
            free = ",order_free" if c.order_free else ""
            self.lines.append(f"{n}=Combiner({c.name!r},{lhs},{rhs},{res},{ident}{free})")
        return n

    def expr(self, e):
        """The id of expression ``e`` (each distinct node written once, children first)."""
        from .expr import Const, Var
        from .visitor import post_order

        n = self._nodes.get(id(e))
        if n is not None:
            return n
        for node in post_order(e):
            if id(node) in self._nodes:
                continue
            if isinstance(node, Var):
                self._nodes[id(node)] = self.var(node)
                continue
            if isinstance(node, Const):
                attr = f"{type(node.attr).__name__}:{node.attr!r}"
            else:
                attr = self.value(node.attr)
            args = ",".join(self._nodes[id(a)] for a in node.args)
            name = f"e{len(self._nodes)}"
            self._nodes[id(node)] = name
            self.lines.append(f"{name}={type(node).__name__}[{attr}]({args}):{node.dtype}")
        return self._nodes[id(e)]

    # -- the graph ------------------------------------------------------------
    def graph(self, roots):
        """Write every stage reachable from ``roots`` (Tensors), producers first."""
        from .tensor import ComputeOp, PlaceholderOp, ScatterAddOp, topo_order

        for op in topo_order(list(roots)):
            if id(op) in self._ops:
                continue
            if isinstance(op, ComputeOp):
                axis = [self.var(a) for a in op.axis]
                body = [self.expr(b) for b in op.body]
                text = (f"compute({op.name!r},{axis},{body},{op.tag!r},"
                        f"{self.value(op.attrs)})")
            elif isinstance(op, ScatterAddOp):
                axis = [self.var(a) for a in op.axis]
                idx = [self.expr(i) for i in op.indices]
                init = None if op.init is None else self.tensor(op.init)
                text = (f"scatter_add({op.name!r},{op.shape},{op.dtypes},{axis},{idx},"
                        f"{self.expr(op.value)},{self.expr(op.where)},{init})")
            elif type(op) is PlaceholderOp:
                text = f"placeholder({op.name!r},{op.shape},{op.dtypes})"
            else:
                raise Uncacheable(f"operation {op.name} of kind {type(op).__name__}")
            pos = self._ops[id(op)] = len(self._ops)
            self._own(op)
            for t in op.outputs:
                self._own(t)
            self.lines.append(f"T{pos}={text}")
        return self


def canonical(roots, extra=()):
    """The :class:`Canonical` text of the graph reachable from ``roots`` (Tensors),
    followed by one line per ``extra`` value (e.g. which tensors are the inputs).

    Raises :class:`Uncacheable` when the graph holds what the text cannot describe."""
    c = Canonical().graph(roots)
    for v in extra:
        c.lines.append("arg " + c.value(v))
    return c


# ---- keys ----------------------------------------------------------------------------


def _source_fingerprint():
    """sha256 of texpr's own source files (texpr, texpr.simplify, texpr.codegen),
    computed once per process."""
    if _FINGERPRINT:
        return _FINGERPRINT[0]
    import importlib.util

    h = hashlib.sha256()
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    for sub in ("texpr.simplify", "texpr.codegen"):
        try:
            spec = importlib.util.find_spec(sub)
            dirs.extend(spec.submodule_search_locations or [])
        except (ImportError, AttributeError, ValueError):
            h.update(f"no {sub}".encode())
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs[:] = sorted(s for s in subdirs if s != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    p = os.path.join(root, f)
                    try:
                        with open(p, "rb") as fh:
                            data = fh.read()
                    except OSError:
                        data = b"?"
                    h.update(os.path.relpath(p, d).encode() + b"\0" + data + b"\0")
    versions = [sys.version]
    from importlib import metadata

    for dist in ("numpy", "sympy", "islpy", "numba"):
        try:
            versions.append(f"{dist}={metadata.version(dist)}")
        except Exception:  # noqa: BLE001 - not installed
            versions.append(f"{dist}=none")
    h.update("\n".join(versions).encode())
    _FINGERPRINT.append(h.hexdigest())
    return _FINGERPRINT[0]


def _key(kind, canon):
    head = (f"texpr symbolic cache {FORMAT}\n{kind}\n{__version__}\n{_source_fingerprint()}\n"
            f"{settings_changed()!r}\n")
    return hashlib.sha256((head + canon.text).encode("utf-8")).hexdigest()


#: module name -> {NAME: default value} of its tuning constants, read from its source
_DEFAULTS = {}


def _defaults(module):
    """The tuning constants of ``module`` as its source assigns them: every top-level
    one-line ``NAME = <literal>`` with an upper-case name (``CHEAP_TREE_NODES =
    96``, ``BLAS_MIN_FLOP = 1 << 17``), evaluated as constant arithmetic on
    literals (anything else is no tuning constant)."""
    name = module.__name__
    got = _DEFAULTS.get(name)
    if got is not None:
        return got
    got = {}
    path = getattr(module, "__file__", None)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, TypeError, ValueError):
        text = ""
    for m in _CONSTANT.finditer(text):
        try:
            value = eval(m.group(2), {"__builtins__": {}})  # noqa: S307 - no names: literals
        except Exception:  # noqa: BLE001 - not a literal
            continue
        if isinstance(value, (bool, int, float, str, tuple, type(None))):
            got[m.group(1)] = value
    _DEFAULTS[name] = got
    return got


_CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]*) = ([-+*/()<>. 0-9a-zA-Z_\"']+?)\s*(?:#.*)?$",
                       re.MULTILINE)


def settings_changed():
    """The tuning constants of texpr's loaded modules that differ from their source's
    value, sorted ``(module, name, value)``: a program changes with them, so they
    are part of every key (a module not loaded yet has its defaults, which the
    source fingerprint covers). ``contraction.BLAS_MIN_FLOP = 1 << 60`` set at
    run time gives other keys than the default: no lowered program of the
    default is loaded for it (or the reverse)."""
    out = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "texpr" or name.startswith("texpr.")):
            continue
        for knob, default in _defaults(module).items():
            value = getattr(module, knob, default)
            if not isinstance(value, (bool, int, float, str, tuple, type(None))):
                continue  # state, not a setting (the profiler's recorder)
            if value != default or type(value) is not type(default):
                out.append((name, knob, repr(value)))
    return sorted(out)


# ---- pickling with the caller's objects by position ------------------------------------


class _Pickler(FlatPickling, pickle.Pickler):
    def __init__(self, f, refs):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self._refs = refs

    def persistent_id(self, obj):
        pos = self._refs.get(id(obj))
        return None if pos is None else pos


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, objects):
        super().__init__(f)
        self._objects = objects

    def persistent_load(self, pid):
        if not isinstance(pid, int) or not 0 <= pid < len(self._objects):
            raise pickle.UnpicklingError(f"persistent id {pid!r} names no object of the graph")
        return self._objects[pid]


def _dumps(result, canon):
    """The payload of ``result``: its pickle, or, for a graph too deep for pickle's
    recursion (GPT-8L's gradients: ``RecursionError``, so every warm run repeated
    the symbolic work), the pickle :mod:`texpr.pickle_order` arranges, which has
    no depth limit."""
    buf = io.BytesIO()
    try:
        _Pickler(buf, canon.refs).dump(result)
    except RecursionError:
        buf = io.BytesIO()
        _Pickler(buf, canon.refs).dump_flat(result, canon.refs, pickle.HIGHEST_PROTOCOL)
    return buf.getvalue()


def _loads(payload, canon):
    """The result of a payload :func:`_dumps` wrote, bound to ``canon``'s objects."""
    got = _Unpickler(io.BytesIO(payload), canon.objects).load()
    return unflat(got) if is_flat(got) else got


def _entry_bytes(key, payload):
    return (_MAGIC + key.encode() + b"\n" + hashlib.sha256(payload).hexdigest().encode()
            + b"\n" + payload)


def _parse_entry(data, key):
    """The payload of entry ``data`` for ``key``; ValueError when it is not one."""
    if not data.startswith(_MAGIC):
        raise ValueError("it does not start with the symbolic cache's header")
    rest = data[len(_MAGIC):]
    parts = rest.split(b"\n", 2)
    if len(parts) != 3:
        raise ValueError("its header is truncated")
    if parts[0] != key.encode():
        raise ValueError("it holds the entry of another key")
    payload = parts[2]
    if hashlib.sha256(payload).hexdigest().encode() != parts[1]:
        raise ValueError(f"its checksum does not match its {len(payload)} bytes (truncated "
                         "or overwritten)")
    return payload


def _unusable(exc):
    _warn_once(("dir", os.environ.get("TEXPR_CACHE_DIR")),
               f"texpr: the symbolic cache directory cannot be used ({type(exc).__name__}: "
               f"{str(exc)[:300]}); differentiation, simplification and lowering are "
               "recomputed every run (set TEXPR_CACHE_DIR to a writable directory, or "
               "TEXPR_SYMBOLIC_CACHE=0 to turn this cache off)")


def _directory():
    """The symbolic entries' directory (created only when an entry is written), or
    None (one warning) when the cache directory is unusable."""
    try:
        root = _cache.cache_dir()
        d = os.path.join(root, _cache.SYMBOLIC_SUBDIR)
        for p in (root, d):
            if os.path.exists(p) and not os.access(p, os.W_OK | os.X_OK):
                raise PermissionError(f"the directory {p} is not writable")
        return d
    except OSError as exc:
        _unusable(exc)
        return None


def _discard(path, why):
    try:
        os.unlink(path)
    except OSError:
        pass
    stats["discard"] += 1
    _warn_once(("entry", path),
               f"texpr: the symbolic cache entry {path} was discarded ({why}); its result "
               "is recomputed and stored again")


def _load(path, key, canon, check):
    """The result stored at ``path`` bound to ``canon``'s objects, or None (missing,
    or discarded with a warning)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _discard(path, f"unreadable: {type(exc).__name__}: {exc}")
        return None
    try:
        payload = _parse_entry(data, key)
        result = _loads(payload, canon)
        why = check(result)
        if why:
            raise ValueError(why)
    except Exception as exc:  # noqa: BLE001 - whatever a bad file makes pickle raise
        _discard(path, f"{type(exc).__name__}: {str(exc)[:200]}")
        return None
    _cache.touch(path)
    return result


def _store(d, path, key, result, canon):
    try:
        payload = _dumps(result, canon)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is not cached
        _warn_once(("pickle", type(exc).__name__),
                   f"texpr: a symbolic result could not be pickled ({type(exc).__name__}: "
                   f"{str(exc)[:200]}); it is not cached")
        return
    data = _entry_bytes(key, payload)
    created = not os.path.isdir(d)
    try:
        if created:
            os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        if created:
            try:
                os.rmdir(d)  # only if empty: leave an unusable directory as it was
            except OSError:
                pass
        _unusable(exc)
        return
    stats["store"] += 1
    _cache.enforce_size_bound(keep=(path,), written=len(data))


def memo(kind, roots, extra, compute, check=None, after_load=None):
    """``compute()``, or its result stored on disk for the same input graph.

    Args:
        kind: the name of the call (``"differentiate"``, ``"simplify"``, ``"lower"``).
        roots: the Tensors whose graph is the input (all of it goes into the key).
        extra: the call's other arguments, as values :meth:`Canonical.value`
            describes (tensors of the graph, plain data); or a callable
            ``canonical -> list of values`` (for values that need the numbering).
        compute: a function of no argument computing the result.
        check: ``result -> None or a reason`` rejecting a loaded result of the
            wrong kind (then the entry is discarded and ``compute()`` runs).
        after_load: ``result -> result`` applied to a loaded result.
    Returns:
        The result: computed (and stored), or loaded and bound to the caller's
        objects. Errors of ``compute()`` propagate; the cache itself never raises.
    """
    if not enabled():
        return compute()
    try:
        c = canonical(roots)
        for v in (extra(c) if callable(extra) else extra):
            c.lines.append("arg " + c.value(v))
        key = _key(kind, c)
    except Exception:  # noqa: BLE001 - Uncacheable, or arguments compute() will reject
        stats["uncacheable"] += 1
        return compute()
    d = _directory()
    if d is None:
        return compute()
    path = os.path.join(d, f"{kind}-{key[:40]}.pkl")
    if os.path.isdir(path):
        # not ours to remove (nothing texpr writes is a directory): this entry is
        # recomputed and not stored, every other entry of the cache still serves
        _warn_once(("blocked", path),
                   f"texpr: the symbolic cache entry {path} is a directory, not a file; "
                   "this result is recomputed and not stored (remove the directory to "
                   "cache it again); the rest of the cache is used as usual")
        stats["miss"] += 1
        return compute()
    result = _load(path, key, c, check or (lambda r: None))
    if result is not None:
        stats["hit"] += 1
        return after_load(result) if after_load is not None else result
    stats["miss"] += 1
    result = compute()
    _store(d, path, key, result, c)
    return result
