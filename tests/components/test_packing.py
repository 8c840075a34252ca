"""Packing engines onto shared GPUs: the invariants, for any mix of replicas (hypothesis)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from components.base import catalog, packing
from components.base.packing import Engine, Mechanism

FRACTIONS = st.sampled_from([0.05, 0.1, 0.125, 0.2, 0.25, 0.3, 0.33, 0.4, 0.5, 0.6, 0.75, 0.9])
MIG_GPUS = st.sampled_from(sorted(g.name for g in catalog.GPUS.values() if g.mig_profiles))


def _engines(draw_fractions: list[float], whole: list[int]) -> list[Engine]:
    shared = [Engine(f"s{i}", fraction=f) for i, f in enumerate(draw_fractions)]
    return shared + [Engine(f"w{i}", gpus=g) for i, g in enumerate(whole)]


def _placed_once(engines: list[Engine], p: packing.Packing) -> None:
    seated = Counter(s.model for load in p.gpus for s in load.seats)
    expected = Counter({e.model: (e.gpus if e.whole else 1) for e in engines})
    assert seated == expected


@settings(max_examples=300, deadline=None)
@given(
    fractions=st.lists(FRACTIONS, max_size=40),
    whole=st.lists(st.sampled_from([1, 2, 4]), max_size=4),
    fewer_slots=st.integers(min_value=0, max_value=3),
    gpus_per_node=st.sampled_from([1, 4, 8]),
)
def test_time_slicing_never_over_memory_or_slots(
    fractions: list[float], whole: list[int], fewer_slots: int, gpus_per_node: int
) -> None:
    engines = _engines(fractions, whole)
    slots = max(1, packing.slots_for(fractions) - fewer_slots)
    p = packing.pack(Mechanism.TIME_SLICING, engines, "L40S", gpus_per_node, slots)
    _placed_once(engines, p)
    for load in p.gpus:
        models = [s.model for s in load.seats]
        if any(m.startswith("w") for m in models):
            assert len(models) == 1  # a whole-GPU replica is never shared
            continue
        assert len(load.seats) <= slots  # never more engines than the device plugin's replicas
        assert load.memory_fraction <= 1 + 1e-9  # never over the GPU's memory
        utilisation = sum(packing.shared_memory_utilization(s.memory_fraction) for s in load.seats)
        assert utilisation <= packing.SHARED_GPU_SAFE_TOTAL + 1e-9
    # Kubernetes may put *any* `slots` replicas together: even the largest ones fit.
    if fractions:
        worst = sorted(fractions, reverse=True)[:slots]
        assert sum(worst) <= 1 + 1e-9
    assert p.nodes == -(-len(p.gpus) // gpus_per_node)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), gpu=MIG_GPUS, whole=st.lists(st.just(1), max_size=3))
def test_mig_instances_never_overlap_or_exceed_the_gpu(
    data: st.DataObject, gpu: str, whole: list[int]
) -> None:
    profiles = data.draw(st.lists(st.sampled_from(catalog.GPUS[gpu].mig_profiles), max_size=30))
    engines = [Engine(f"m{i}", profile=p) for i, p in enumerate(profiles)] + _engines([], whole)
    p = packing.pack(Mechanism.MIG, engines, gpu, 8)
    _placed_once(engines, p)
    by_name = {pr.name: pr for pr in catalog.GPUS[gpu].mig_profiles}
    for load in p.gpus:
        if any(s.model.startswith("w") for s in load.seats):
            assert len(load.seats) == 1
            continue
        used: list[int] = []
        compute = 0
        for seat in load.seats:
            assert seat.profile is not None and seat.start is not None
            profile = by_name[seat.profile]
            assert seat.start in profile.placements  # a documented placement
            used += range(seat.start, seat.start + profile.memory_slices)
            compute += profile.compute_slices
        assert len(used) == len(set(used)) <= catalog.MIG_MEMORY_SLICES  # instances never overlap
        assert compute <= catalog.MIG_COMPUTE_SLICES
        assert len(load.seats) <= 7  # the most instances any of these GPUs has
        assert Counter(s.profile for s in load.seats)[seat.profile] <= profile.max_instances


@given(fraction=FRACTIONS, others=st.lists(FRACTIONS, max_size=8), gpus=st.sampled_from([1, 2, 4, 8]))
def test_a_shared_replica_never_costs_more_than_a_whole_gpu(
    fraction: float, others: list[float], gpus: int
) -> None:
    slots = packing.slots_for([fraction, *others])
    assert 0 < packing.gpu_share(Engine("m", fraction=fraction), slots) <= packing.gpu_share(Engine("w"), 1)
    for profiles in (g.mig_profiles for g in catalog.GPUS.values() if g.mig_profiles):
        for profile in profiles:
            assert 0 < packing.gpu_share(Engine("m", profile=profile), 1) <= 1
    assert packing.gpu_share(Engine("w", gpus=gpus), 1) == gpus


def test_the_guide_s_instance_counts() -> None:
    """Instances available per profile, as the MIG user guide's tables list them (A100-40GB shown)."""
    counts = {p.name: p.max_instances for p in catalog.A100_40GB.mig_profiles}
    assert counts == {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}
    # a 4g and a 3g instance fill a GPU together; two 4g instances never do
    four, three = catalog.H100.mig_profile("4g.40gb"), catalog.H100.mig_profile("3g.40gb")
    assert four is not None and three is not None
    assert len(packing.pack_mig([Engine("a", profile=four), Engine("b", profile=three)])) == 1
    assert len(packing.pack_mig([Engine("a", profile=four), Engine("b", profile=four)])) == 2


def test_slots_follow_the_largest_fraction() -> None:
    assert packing.slots_for([0.25, 0.1]) == 4
    assert packing.slots_for([0.3]) == 3
    assert packing.slots_for([0.5, 0.5]) == 2
    assert packing.slots_for([0.01]) == packing.MAX_TIME_SLICES
    assert packing.shared_memory_utilization(0.5) == 0.45


@settings(max_examples=200, deadline=None)
@given(data=st.data(), gpu=MIG_GPUS, gpus_per_node=st.sampled_from([1, 2, 4, 8]))
def test_mig_nodes_are_cut_alike_and_together_hold_every_replica(
    data: st.DataObject, gpu: str, gpus_per_node: int
) -> None:
    models = data.draw(st.lists(st.sampled_from(catalog.GPUS[gpu].mig_profiles), min_size=1, max_size=4))
    replicas = data.draw(st.lists(st.integers(1, 12), min_size=len(models), max_size=len(models)))
    engines = [
        Engine(f"m{i}", profile=p)
        for i, (p, n) in enumerate(zip(models, replicas, strict=True))
        for _ in range(n)
    ]
    found = packing.mig_node_layout(engines, gpus_per_node)
    if found is None:  # one replica of each model does not fit one node
        assert (
            len(packing.pack_mig([Engine(f"m{i}", profile=p) for i, p in enumerate(models)])) > gpus_per_node
        )
        return
    nodes, layout = found
    assert len(layout) <= gpus_per_node
    per_node = Counter(s.model for load in layout for s in load.seats)
    for i, n in enumerate(replicas):
        assert nodes * per_node[f"m{i}"] >= n  # every replica has an instance somewhere
    for load in layout:
        used = [
            x
            for s in load.seats
            for x in range(
                s.start or 0, (s.start or 0) + catalog.GPUS[gpu].mig_profile(s.profile or "").memory_slices
            )
        ]  # type: ignore[union-attr]
        assert len(used) == len(set(used)) <= catalog.MIG_MEMORY_SLICES
    config = packing.mig_parted_config("c", layout, gpus_per_node)["mig-configs"]["c"]  # type: ignore[index]
    devices = sorted(d for entry in config for d in entry["devices"])
    assert devices == list(range(gpus_per_node))  # every GPU of the node, once
    instances = sum(sum(e.get("mig-devices", {}).values()) * len(e["devices"]) for e in config)
    assert instances == sum(per_node.values())
