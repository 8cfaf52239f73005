"""The text of a generated kernel: user names only in escaped comments, buffers
named after their tensors, no dead assignments.

:func:`codegen.loopnest.lower.lower` writes the kernel with *canonical* identifiers
(buffers ``in0``, ``out0``, ``tmp0``; loop variables ``c0_0``; ...) and with
comment lines that carry no user text (``# ---- stage 0``). That text is a
function of the graph's structure alone: it is what the caches key on and what
is written to disk, so no name can reach a module that Python executes.
:func:`finish` derives the *readable* text shown as ``Kernel.source``: the same
lines (so line numbers agree with the module on disk), with the buffers renamed
after their tensors (:func:`buffer_identifiers`) and every stage's comment
holding its definition (``te.tensor_str``), escaped by :func:`comment_text`.

Why escaping is needed at all: Python ends a comment at ``\\n``, ``\\r`` and
``\\r\\n`` (so a stage named ``"Y\\rimport os"`` would put code in the module),
and ``str.splitlines`` also splits at ``\\x0b \\x0c \\x1c \\x1d \\x1e \\x85
\\u2028 \\u2029``. :func:`comment_text` keeps only printable characters
(``str.isprintable``, which excludes all of those, other control characters,
lone surrogates and unassigned code points), so the comment stays one line for
every reader and the text encodes as UTF-8.
"""

import ast
import io
import re
import threading
import tokenize

from .memo import TextMemo
from . import dialect as _dialect

__all__ = ["comment_text", "buffer_identifiers", "rename", "remove_dead_assignments",
           "parse_module", "set_parse_lock"]

_PARSE_LOCK = [threading.RLock()]

def parse_module(source):
    """``ast.parse(source)``, one thread at a time: CPython before 3.11.8/3.12.1
    keeps the AST converter's recursion depth in state shared by all threads, so
    two threads parsing or compiling at once fail with ``SystemError: AST
    constructor recursion depth mismatch`` (CPython gh-106905). Kernels are
    built from several threads when a framework op is first called (or first
    differentiated) from several threads at once. The lock is the backend's
    compiler lock (re-entrant, registered with :func:`set_parse_lock`), the one
    it compiles a unit's text under: a lock of our own let a parse here run
    beside a compile there (CI, tests/test_codegen_cache.py, 4 threads
    building: the same SystemError)."""
    with _PARSE_LOCK[0]:
        return ast.parse(source)


def set_parse_lock(lock):
    """Parse under ``lock`` (a re-entrant lock): the one the backend compiles
    generated text under (see :func:`parse_module`)."""
    _PARSE_LOCK[0] = lock


def comment_text(text):
    """``text`` (any str) as one line fit for a ``#`` comment: every non-printable
    character (line and paragraph separators, control characters, lone
    surrogates, unassigned code points) and the backslash become Python escape
    sequences (``\\n``, ``\\x1c``, ``\\u2028``, ``\\ud800``, ``\\\\``), so the result
    is one line for Python's tokenizer and for ``str.splitlines``, encodes as
    UTF-8, and still shows the name. Non-str values are shown by ``repr``."""
    if not isinstance(text, str):
        text = repr(text)
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii")
                       if not 0xD800 <= ord(ch) <= 0xDFFF else f"\\u{ord(ch):04x}")
    return "".join(out)


_ASCII_IDENT = re.compile(r"[^A-Za-z0-9_]")


def buffer_identifiers(names):
    """Readable, unique Python identifiers for buffers of tensors named ``names``
    (a list of str, in argument order): each name keeps its ASCII letters,
    digits and underscores (``"conv2d.red0"`` -> ``conv2dred0``; a name left
    empty becomes ``t``, one starting with a digit gets a ``t`` in front), then a
    trailing underscore, which no keyword, builtin or generated local has
    (``Y_``, ``in_``, ``max_``); names that collide get ``_1_``, ``_2_``, ... in
    order. Returns a list of str."""
    used = set()
    out = []
    for name in names:
        base = _ASCII_IDENT.sub("", name) if isinstance(name, str) else ""
        if not base or base[0].isdigit():
            base = "t" + base
        cand = base + "_"
        k = 1
        while cand in used:
            cand = f"{base}_{k}_"
            k += 1
        used.add(cand)
        out.append(cand)
    return out


#: NAME tokens of the texts :func:`rename` has seen in this process
_TOKENS = TextMemo(1 << 23)


def _name_tokens(source):
    """``((row, start column, end column, identifier), ...)`` of ``source``'s NAME
    tokens (rows from 0), remembered per text: the units of repeated layers have
    the same text and are renamed with other names."""
    got = _TOKENS.get(source)
    if got is None:
        got = tuple((tok.start[0] - 1, tok.start[1], tok.end[1], tok.string)
                    for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                    if tok.type == tokenize.NAME)
        _TOKENS.put(source, got, len(source) + 8 * len(got))
    return got


def rename(source, mapping):
    """``source`` (Python text) with every NAME token in ``mapping`` (identifier ->
    identifier) replaced; comments and strings are left alone."""
    lines = source.splitlines(keepends=True)
    edits = {}
    for row, col, end, name in _name_tokens(source):
        if name in mapping:
            edits.setdefault(row, []).append((col, end, mapping[name]))
    for row, spans in edits.items():
        ln = lines[row]
        for col, end, new in sorted(spans, reverse=True):
            ln = ln[:col] + new + ln[end:]
        lines[row] = ln
    return "".join(lines)


# ---- dead and repeated assignments ------------------------------------------------------

#: calls without side effects (anything else, e.g. the ``_ck``/``_nz`` checks that
#: set the error flag, keeps its statement)
#: (and the target's pure runtime helpers, :attr:`codegen.loopnest.dialect.Dialect.helper_names`)
_PURE_NAMES = {"min", "max", "abs", "int", "float", "bool"}
_PURE_MODULES = {"np", "math"}


def _pure(node):
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name) and (f.id in _PURE_NAMES
                                            or f.id in _dialect.current().helper_names):
                continue
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and f.value.id in _PURE_MODULES:
                continue
            return False
        elif isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda)):
            return False
    return True


def _reads(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}


class _Unsupported(Exception):
    pass


def _simple_target(st):
    if isinstance(st, ast.Assign) and len(st.targets) == 1 \
            and isinstance(st.targets[0], ast.Name):
        return st.targets[0].id
    return None


def _repeats(body, facts, drop, assume, changed):
    """Forward pass: ``x = e`` where ``x`` already holds ``e`` (same text, nothing
    it reads reassigned since) on every path is dropped (its line number added
    to ``drop``). ``facts``: {name: (dump of e, names e reads)} holding on entry;
    returns the facts holding at the end. Only pure ``e`` without loads from
    buffers are tracked (a store to a buffer never invalidates a fact).

    A loop's body starts with the facts assumed to hold on every iteration,
    ``assume[id(loop)]`` (optimistic at first: all facts on entry); when the end
    of the body does not keep one of them, the assumption shrinks and
    ``changed[0]`` is set: the caller repeats the pass until nothing changes
    (each pass is linear; the facts only shrink)."""
    facts = dict(facts)

    def kill(name):
        for k in [k for k, (_, deps) in facts.items() if k == name or name in deps]:
            del facts[k]

    for st in body:
        tgt = _simple_target(st)
        if tgt is not None:
            text = ast.dump(st.value)
            if facts.get(tgt, (None,))[0] == text:
                drop.add(st.lineno)
                continue
            kill(tgt)
            deps = _reads(st.value)
            if (_pure(st.value) and tgt not in deps
                    and not any(isinstance(n, ast.Subscript) for n in ast.walk(st.value))):
                facts[tgt] = (text, deps)
        elif isinstance(st, ast.AugAssign):
            if isinstance(st.target, ast.Name):
                kill(st.target.id)
        elif isinstance(st, ast.Assign):
            for t in st.targets:
                if not isinstance(t, (ast.Subscript, ast.Name)):
                    raise _Unsupported()
                if isinstance(t, ast.Name):
                    kill(t.id)
        elif isinstance(st, ast.For):
            if not isinstance(st.target, ast.Name) or st.orelse:
                raise _Unsupported()
            t = st.target.id
            entry = {k: v for k, v in facts.items() if k != t and t not in v[1]}
            a = assume.get(id(st))
            top = entry if a is None else {k: v for k, v in entry.items() if a.get(k) == v}
            end = _repeats(st.body, top, drop, assume, changed)
            kept = {k: v for k, v in top.items() if end.get(k) == v}
            if kept != top:
                changed[0] = True
            assume[id(st)] = kept
            # after the loop: what held before it and (if it ran) at the end of the body
            facts = {k: v for k, v in entry.items() if end.get(k) == v}
        elif isinstance(st, ast.If):
            a = _repeats(st.body, facts, drop, assume, changed)
            b = _repeats(st.orelse, facts, drop, assume, changed)
            facts = {k: v for k, v in a.items() if b.get(k) == v}
        elif isinstance(st, (ast.Expr, ast.Pass, ast.Return)):
            pass
        else:
            raise _Unsupported()
    return facts


def _summary(body, drop, memo):
    """``(gen, kill)`` of a statement list for liveness: ``live_before =
    gen | (live_after - kill)`` (gen: names read before any assignment on some
    path; kill: names assigned on every path). A loop may run zero times (kill
    nothing), and its head is live with ``after | (gen(body) - {target})``:
    closed forms, so each pass is linear."""
    key = id(body)
    if key in memo:
        return memo[key]
    gen, kill = set(), set()
    for st in reversed(body):
        if st.lineno in drop:
            continue
        g, k = _stmt_summary(st, drop, memo)
        gen = g | (gen - k)
        kill |= k
    memo[key] = (gen, kill)
    return gen, kill


def _stmt_summary(st, drop, memo):
    tgt = _simple_target(st)
    if tgt is not None:
        return _reads(st.value), {tgt}
    if isinstance(st, ast.AugAssign):
        r = _reads(st)
        if isinstance(st.target, ast.Name):
            return r | {st.target.id}, {st.target.id}
        return r, set()
    if isinstance(st, ast.For):
        g, _ = _summary(st.body, drop, memo)
        return _reads(st.iter) | (g - {st.target.id}), set()
    if isinstance(st, ast.If):
        gt, kt = _summary(st.body, drop, memo)
        ge, ke = _summary(st.orelse, drop, memo)
        return _reads(st.test) | gt | ge, kt & ke
    return _reads(st), set()


def _live(body, live, drop, memo):
    """Backward pass over ``body`` given the names live after it: a pure ``x = e``
    whose ``x`` is not live after it (overwritten before any read on every
    path, or never read) is added to ``drop``. Returns the names live before."""
    live = set(live)
    for st in reversed(body):
        if st.lineno in drop:
            continue
        tgt = _simple_target(st)
        if tgt is not None and tgt not in live and _pure(st.value):
            drop.add(st.lineno)
            continue
        if isinstance(st, ast.For):
            g, _ = _summary(st.body, drop, memo)
            head = live | (g - {st.target.id})
            _live(st.body, head, drop, memo)
            live = head | _reads(st.iter)
        elif isinstance(st, ast.If):
            a = _live(st.body, live, drop, memo)
            b = _live(st.orelse, live, drop, memo)
            live = a | b | _reads(st.test)
        else:
            g, k = _stmt_summary(st, drop, memo)
            live = g | (live - k)
    return live


def remove_dead_assignments(source, func="kernel"):
    """``source`` without the assignments of function ``func`` that change
    nothing: a ``x = e`` repeating the value ``x`` holds on every path (the
    statement variables rebound before each statement of a loop nest), and a
    ``x = e`` whose value no path reads. Only side-effect-free ``e`` are removed;
    a block left empty gets ``pass``. The text is otherwise unchanged (line
    structure, comments). Code outside the shapes the generator emits (one
    statement per line; ``for``/``if``/assignments) is returned as it is. A
    ``pass`` beside other statements goes too."""
    tree = parse_module(source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func), None)
    if fn is None:
        return source
    assume = {}
    try:
        while True:
            drop, changed = set(), [False]
            _repeats(fn.body, {}, drop, assume, changed)
            if not changed[0]:
                break
        # dead values: iterate (removing one may make another dead)
        while True:
            n = len(drop)
            _live(fn.body, set(), drop, {})
            if len(drop) == n:
                break
    except _Unsupported:
        return source
    for n in ast.walk(fn):
        for body in (getattr(n, "body", None), getattr(n, "orelse", None)):
            if isinstance(body, list):
                kept = [st for st in body if st.lineno not in drop]
                if len(kept) > 1:
                    drop.update(st.lineno for st in kept if isinstance(st, ast.Pass))
    if not drop:
        return source
    stmts = {n.lineno: n for n in ast.walk(fn) if isinstance(n, ast.stmt)}
    if any(stmts[ln].end_lineno != ln for ln in drop):
        return source
    lines = source.splitlines(keepends=True)
    out = []
    for k, ln in enumerate(lines, start=1):
        if k not in drop:
            out.append(ln)
    # a block (a line ending with ':') left without a body gets `pass`
    fixed = []
    for k, ln in enumerate(out):
        fixed.append(ln)
        s = ln.rstrip()
        if s.endswith(":") and not s.lstrip().startswith("#"):
            ind = len(ln) - len(ln.lstrip())
            nxt = next((x for x in out[k + 1:] if x.strip() and not x.lstrip().startswith("#")),
                       "")
            if len(nxt) - len(nxt.lstrip()) <= ind or not nxt.strip():
                fixed.append(" " * (ind + 4) + "pass\n")
    return "".join(fixed)
