"""Coverage: each subproblem's own inputs (get_inputs / get_input_configs) must cover every instantiation
the top-level makes and every call it makes to it."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from mkevolve.verify.decomposition.recording import Instance
from mkevolve.verify.decomposition.results import FORWARD_COVERAGE, INIT_COVERAGE, CheckResult
from mkevolve.verify.decomposition.signatures import Signature


@dataclass
class SubproblemFacts:
    """A subproblem as its own file describes it: one (init, inputs) signature pair per config."""

    name: str
    configs: list[tuple[Signature | None, Signature | None]]
    has_config_list: bool


def coverage_checks(facts: dict[str, SubproblemFacts], instances: list[Instance]) -> list[CheckResult]:
    """The forward and init coverage checks over every subproblem instance the top-level built."""
    forward_gaps, init_gaps = [], []
    by_name: dict[str, list[Instance]] = {}
    for instance in instances:
        by_name.setdefault(instance.name, []).append(instance)
    for name, named in by_name.items():
        fact = facts.get(name)
        if fact is None:
            forward_gaps.append(f"{name}: not checked, the subproblem does not load on its own")
            continue
        forward_gaps += _forward_gaps(fact, named)
        init_gaps += _init_gaps(fact, named)
    return [CheckResult(FORWARD_COVERAGE, not forward_gaps, "; ".join(forward_gaps)),
            CheckResult(INIT_COVERAGE, not init_gaps, "; ".join(init_gaps))]


def _forward_gaps(fact: SubproblemFacts, instances: list[Instance]) -> list[str]:
    offered = {inputs for _, inputs in fact.configs if inputs is not None}
    gaps = []
    for instance in instances:
        for call in dict.fromkeys(instance.calls):
            if call is None:
                gaps.append(f"{fact.name} ('{instance.attribute}') is called with arguments its forward does not "
                            "accept")
            elif call not in offered:
                gaps.append(f"{fact.name} ('{instance.attribute}') is called with {call.render()}, but its "
                            f"inputs offer only {_offer(offered)}; add a get_input_configs entry for this call")
    return gaps


def _init_gaps(fact: SubproblemFacts, instances: list[Instance]) -> list[str]:
    offered = {init for init, _ in fact.configs if init is not None}
    gaps = []
    for instance in instances:
        if instance.init is None:
            gaps.append(f"{fact.name} ('{instance.attribute}') is built with arguments its __init__ does not accept")
        elif instance.init not in offered:
            gaps.append(f"{fact.name} ('{instance.attribute}') is built with {instance.init.render()}, but its "
                        f"init inputs offer only {_offer(offered)}")
    count, entries = len(instances), len(fact.configs)
    if count > 1 and not fact.has_config_list:
        gaps.append(f"{fact.name} is instantiated {count} times, so it must define get_input_configs() with one "
                    "entry per instantiation")
    elif fact.has_config_list and entries != count:
        gaps.append(f"{fact.name} has {entries} get_input_configs() entries but is instantiated {count} "
                    "time(s); keep exactly one entry per instantiation")
    elif count > 1 and not gaps:
        gaps += _unpaired(fact, instances)
    return gaps


def _offer(signatures: set) -> str:
    rendered = sorted(s.render() for s in signatures)
    return " | ".join(rendered) if rendered else "nothing"


def _unpaired(fact: SubproblemFacts, instances: list[Instance]) -> list[str]:
    """Instantiations and get_input_configs entries left over by a maximum one-to-one pairing (same
    constructor arguments, and every call's inputs equal to the entry's)."""
    graph = nx.Graph()
    left = [("instance", i) for i in range(len(instances))]
    right = [("config", j) for j in range(len(fact.configs))]
    graph.add_nodes_from(left + right)
    for i, instance in enumerate(instances):
        for j, (init, inputs) in enumerate(fact.configs):
            if instance.init == init and all(call == inputs for call in instance.calls):
                graph.add_edge(("instance", i), ("config", j))
    matching = nx.bipartite.hopcroft_karp_matching(graph, top_nodes=left)
    gaps = [f"{fact.name}: instantiation '{instances[i].attribute}' has no get_input_configs() entry of its own "
            "(each entry serves one instantiation)" for kind, i in left if (kind, i) not in matching]
    for kind, j in right:
        if (kind, j) not in matching:
            init, inputs = fact.configs[j]
            described = "; ".join(s.render() for s in (init, inputs) if s is not None)
            gaps.append(f"{fact.name}: get_input_configs()[{j}] ({described}) matches no instantiation the "
                        "top-level makes")
    return gaps
