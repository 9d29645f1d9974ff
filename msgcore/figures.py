"""Architecture figures drawn from a built model, so that a chapter's diagram is the code's, not a drawing of it.

    fig = architecture(model, title="Transformer (small)")

`stacks(model)` finds every layer stack: a module's ModuleList of layers (an encoder's or a decoder's `layers`, a fine
encoder, POSTECH's `src_layers` and `mt_layers`). Each stack becomes a column, read bottom to top: its embeddings, its layers (consecutive layers of the same
structure drawn once, "× N"), then what follows them (final norm, output projection). A layer's line lists its
sub-blocks in the order the module declares them, with their sizes. What attends to what is not in the module tree,
so arrows are drawn only where the caller declares them: `flows={"decoder": ["encoder"]}`.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from msgcore.layers import Dropout

SKIPPED = (nn.Dropout, Dropout, nn.LayerNorm)  # the residual plumbing, not blocks of their own


@dataclass
class Stack:
    name: str  # the stack's attribute path in the model, e.g. "encoder"
    below: list[str]  # boxes under the layers (embeddings)
    layers: list[tuple[str, int]]  # (a layer's text, how many consecutive layers share it)
    above: list[str]  # boxes over the layers (final norm, output projection)


def describe(module: nn.Module) -> str:
    """One block in a few words: its class and the sizes that define it."""
    kind = type(module).__name__
    if isinstance(module, nn.ModuleDict):  # one block per key (MixRep's BPE and SentencePiece streams), a line each
        return "\n".join(f"{key}: {describe(child)}" for key, child in module.items())
    if isinstance(module, nn.Linear):
        return f"{kind} {module.in_features}→{module.out_features}"
    if isinstance(module, nn.Embedding):
        return f"{kind} {module.num_embeddings}×{module.embedding_dim}"
    heads = getattr(module, "n_heads", None)
    if heads:
        return f"{kind} ({heads} heads × {module.head_dim})"
    embeddings = [m for m in module.children() if isinstance(m, nn.Embedding)]
    if embeddings:
        return f"{kind} ({', '.join(describe(m) for m in embeddings)})"
    linears = [m for m in module.children() if isinstance(m, nn.Linear)]
    if linears and len(linears) == len(list(module.children())) - sum(isinstance(m, SKIPPED)
                                                                        for m in module.children()):
        sizes = [linears[0].in_features] + [m.out_features for m in linears]
        return f"{kind} {'→'.join(map(str, sizes))}"
    return kind


def plumbing(module: nn.Module) -> bool:
    """Residual plumbing: a SKIPPED module, or a ModuleDict of them (MixRep's per-stream LayerNorms)."""
    if isinstance(module, nn.ModuleDict):
        return len(module) > 0 and all(map(plumbing, module.values()))
    return isinstance(module, SKIPPED)


def layer_text(layer: nn.Module) -> str:
    blocks = [f"{name}: {describe(child)}" for name, child in layer.named_children() if not plumbing(child)]
    return type(layer).__name__ + "\n" + "\n".join(blocks)


def stacks(model: nn.Module) -> list[Stack]:
    """The model's layer stacks in declaration order: every non-empty ModuleList of a module, named after the module
    when the list is its `layers` and after the list otherwise (POSTECH's joint encoder holds `src_layers` and
    `mt_layers`, each with its own final norm: `src_final_norm`, `mt_final_norm`). A stack inside another stack's
    layers is part of that one."""
    found: list[Stack] = []
    inside: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside) or isinstance(module, nn.ModuleList):
            continue
        children = list(module.named_children())
        order = [n for n, _ in children]
        lists = [(n, c) for n, c in children if isinstance(c, nn.ModuleList) and len(c)]
        prefixes = {attr: attr.removesuffix("layers") for attr, _ in lists}  # "src_layers" -> "src_"
        for attr, layers in lists:
            inside.append(f"{name}.{attr}" if name else attr)
            theirs = [p for a, p in prefixes.items() if a != attr and p]  # a sibling named after another stack (
            others = [(n, c) for n, c in children if not isinstance(c, nn.ModuleList)  # POSTECH's mt_final_norm) is
                      and not any(n.startswith(p) for p in theirs)]  # that stack's alone
            below = [f"{n}: {describe(c)}" for n, c in others if order.index(n) < order.index(attr)]
            above = [f"{n}: {describe(c)}" for n, c in others if order.index(n) > order.index(attr)]
            label = name or type(model).__name__
            if attr != "layers":
                label = f"{name}.{attr}" if name else attr
            found.append(Stack(label, below, group_layers(layers), above))
    return found


def group_layers(layers: nn.ModuleList) -> list[tuple[str, int]]:
    """Each layer's text, consecutive layers of the same text drawn once with their count."""
    grouped: list[tuple[str, int]] = []
    for layer in layers:
        text = layer_text(layer)
        if grouped and grouped[-1][0] == text:
            grouped[-1] = (text, grouped[-1][1] + 1)
        else:
            grouped.append((text, 1))
    return grouped


def architecture(model: nn.Module, title: str | None = None, flows: dict[str, list[str]] | None = None,
                 order: list[str] | None = None):
    """A matplotlib figure of `model`'s stacks, side by side, with an arrow from each stack in `flows[name]` to
    stack `name` (see the module docstring). The columns follow the modules' declaration order, or `order`, which
    names every stack once (TRICE declares its fine encoder after the decoder, but reads it between the two)."""
    import matplotlib.pyplot as plt

    columns = ordered(stacks(model), order)
    if not columns:
        raise ValueError(f"{type(model).__name__} has no layer stack (no module holds a ModuleList of layers)")
    def lines(text: str) -> int:
        return text.count("\n") + 1

    height = max(sum(lines(t) * LINE + GAP for t in [*s.below, *(t for t, _ in s.layers), *s.above]) + 0.5 * len(s.layers)
                 for s in columns) + 1.2
    position = {stack.name: x for x, stack in enumerate(columns)}
    for target, sources in (flows or {}).items():
        for source in sources:
            if source not in position or target not in position:
                raise ValueError(f"flows names {source!r} -> {target!r}; the stacks are {', '.join(position)}")
    skips = any(abs(position[t] - position[s]) > 1 for t, sources in (flows or {}).items() for s in sources)
    height += OVER if skips else 0.0  # room for an arrow drawn over the stack names it passes
    fig, ax = plt.subplots(figsize=(4.4 * len(columns), 0.42 * height + 0.8))
    ax.set_xlim(0, len(columns))
    ax.set_ylim(0, height)
    ax.set_axis_off()
    tops = []
    for x, stack in enumerate(columns):
        y = 0.2
        for text in stack.below:
            y = box(ax, x + 0.5, y, text, "#e8eef7")
        for text, count in stack.layers:
            y = box(ax, x + 0.5, y, text + (f"\n× {count}" if count > 1 else ""), "#fdf0d5")
        for text in stack.above:
            y = box(ax, x + 0.5, y, text, "#e8eef7")
        ax.text(x + 0.5, y, stack.name, ha="center", va="bottom", fontsize=10, fontweight="bold")
        tops.append(y)
    for target, sources in (flows or {}).items():
        for source in sources:
            ax.add_patch(flow_arrow(position[source], position[target], tops))
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def ordered(columns: list[Stack], order: list[str] | None) -> list[Stack]:
    """`columns` in the given order of their names, which must name each of them once."""
    if order is None:
        return columns
    names = [stack.name for stack in columns]
    if sorted(order) != sorted(names):
        raise ValueError(f"order must name each stack once; the stacks are {', '.join(names)}")
    return sorted(columns, key=lambda stack: order.index(stack.name))


LINE, GAP = 0.42, 0.35  # the height of a text line and the gap between two boxes, in axis units
NAME = 0.4  # the height of a stack's name
OVER = 1.2  # the headroom, in axis units, of an arrow that passes over the stacks' names


def flow_arrow(source: int, target: int, tops: list[float]):
    """The arrow from column `source` to column `target`: between neighbours, from the source's top box to the middle
    of the target's stack; past a column in between, from above the source's name over every name to above the
    target's, so that it crosses no box and no name."""
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path

    style = dict(arrowstyle="-|>", mutation_scale=12, color="#555555", zorder=4)  # over the boxes
    rightwards = target > source
    if abs(target - source) == 1:
        return FancyArrowPatch((source + (0.85 if rightwards else 0.15), tops[source] - GAP),
                               (target + (0.15 if rightwards else 0.85), tops[target] / 2),
                               connectionstyle="arc3,rad=-0.25", **style)
    above = NAME + 0.1  # just above a stack's name
    top = max(tops) + above + OVER / 2  # the level at which it passes over every name
    path = Path([(source + 0.5, tops[source] + above), (source + 0.5, top), (target + 0.5, top),
                 (target + 0.5, tops[target] + above)], [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO])
    return FancyArrowPatch(path=path, **style)


def box(ax, x: float, y: float, text: str, color: str) -> float:
    """Draw a box with `text` centred at x from height y; return the height above it."""
    h = (text.count("\n") + 1) * LINE
    ax.text(x, y + h / 2, text, ha="center", va="center", fontsize=8.5, family="monospace",
            bbox=dict(boxstyle="round,pad=0.3", facecolor=color, edgecolor="#666666"))
    return y + h + GAP
