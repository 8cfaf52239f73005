"""What one run of the simplifier did to a graph: :class:`SimplifyRecord`.

One job: the record :func:`texpr.simplify.simplify_with_record` returns and
``te.differentiate`` keeps on its adjoint stages (and the symbolic cache
stores with them), and the table :func:`texpr.simplify.explain` prints from
it. A module of its own, light to import: loading a cached adjoint graph
unpickles its record without importing the pass pipeline (and SymPy).
"""

from texpr.errors import TexprError
from texpr.printer import graph_str
from texpr.tensor import PlaceholderOp, as_tensor_list

from .materialize import iteration_count

__all__ = ["SimplifyRecord", "keep_record", "record_of"]


class SimplifyRecord:
    """What one :func:`simplify` run did to a graph, kept for :func:`explain`.

    Attributes:
        inputs: the list of Tensors simplified.
        outputs: the list returned (same order).
        steps: one ``(round, pass name, before, after)`` per pass run, ``before``
            and ``after`` the whole list of Tensors around that pass.
        rounds: how many rounds of :data:`PIPELINE` ran.
        converged: whether the last round changed nothing (the fixpoint).

    Iteration counts are computed only when :meth:`explain` asks for them.
    """

    def __init__(self, inputs):
        self.inputs = list(inputs)
        self.outputs = None
        self.steps = []
        self.rounds = 0
        self.converged = False

    def positions(self, tensors):
        """The positions of ``tensors`` (members of :attr:`outputs`, by identity).

        Raises:
            TexprError: a tensor is not one of the outputs of this run.
        """
        out = []
        for t in as_tensor_list(tensors, "explain"):
            pos = [n for n, o in enumerate(self.outputs) if o is t]
            if not pos:
                raise TexprError(f"explain: {t.name} is not one of the tensors this "
                                 "simplification returned")
            out.append(pos[0])
        return out

    def explain(self, tensors):
        """The table :func:`explain` prints, for some of this run's outputs.

        Args:
            tensors: a Tensor or list of Tensors, each one of :attr:`outputs`.
        Returns:
            str: the iteration count of their graph before the pipeline, then for
            every pass of every round the count before and after it (``=`` when
            the pass changed none of them), then the final graph.
        Raises:
            TexprError: a tensor is not one of the outputs.
        """
        pos = self.positions(tensors)
        names = ", ".join(self.outputs[n].name for n in pos)

        def pick(graph):
            return [graph[n] for n in pos]

        lines = [f"explain {names}: iteration count "
                 f"{iteration_count(pick(self.inputs)):,} (input)"]
        last_round = self.rounds if self.converged else None
        width = max([len(name) for _r, name, _b, _a in self.steps] + [1])
        for rnd, name, before, after in self.steps:
            if rnd == last_round:
                continue
            b, a = pick(before), pick(after)
            if all(x is y for x, y in zip(a, b)):
                lines.append(f"  round {rnd} {name:{width}s} =")
            else:
                lines.append(f"  round {rnd} {name:{width}s} {iteration_count(b):>12,} -> "
                             f"{iteration_count(a):>12,}")
        if last_round is not None:
            lines.append(f"  round {last_round}: no pass changed the graph")
        final = pick(self.outputs)
        lines.append(f"final: iteration count {iteration_count(final):,}")
        lines.append(graph_str(final))
        return "\n".join(lines)


def record_of(tensor):
    """The :class:`SimplifyRecord` kept on the stage of ``tensor`` by
    ``te.differentiate``, or None (see :func:`keep_record`)."""
    record = getattr(tensor.op, "simplify_record", None)
    if record is None or not any(o is tensor for o in record.outputs or ()):
        return None
    return record


def keep_record(record):
    """Attach ``record`` to the stage of each of its outputs (placeholders
    excepted), so that :func:`explain` of any of them prints it."""
    for t in record.outputs:
        if not isinstance(t.op, PlaceholderOp):
            t.op.simplify_record = record
