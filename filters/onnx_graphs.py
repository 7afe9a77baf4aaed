"""Editing ONNX graphs in place: what the folded open_nsfw graph and its int8 copy both need."""

from __future__ import annotations


def keep_used_nodes(graph, kept) -> set:
    """The graph's nodes become ``kept`` less those whose outputs nothing reads, repeatedly; returns the names
    the remaining nodes and the outputs read."""
    outputs = {output.name for output in graph.output}
    while True:
        used = outputs.union(*(node.input for node in kept))
        alive = [node for node in kept if used.intersection(node.output)]
        if len(alive) == len(kept):
            break
        kept = alive
    del graph.node[:]
    graph.node.extend(kept)
    return used
