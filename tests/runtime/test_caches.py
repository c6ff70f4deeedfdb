"""The runtime's bounded caches: eager executables, compiled programs, view index arrays.

Each bound is a field of ``runtime.config``; these tests set it small, go past it, and
check what falls out (the least recently used entry), that a probe hears it, and that
calling the evicted key again compiles it again and gives PyTorch's CPU result.
"""

from __future__ import annotations

import pytest
import torch

import tpu_debug
from tpu_debug.core.errors import ConfigError
from tpu_debug.runtime import cache_counts, compiled, eager, probes
from tpu_debug.runtime import tensor as tpu_tensor
from tpu_debug.runtime.caches import LruCache
from tpu_debug.runtime.config import RuntimeConfig, config


class _Log:
    """A probe that keeps the compiles and evictions it hears, in order."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.events: list[tuple[str, object]] = []

    def on_compile(self, info) -> None:
        if info.mode == self.mode:
            self.events.append(("compile", info.key))

    def on_evict(self, mode, name, key) -> None:
        if mode == self.mode:
            self.events.append(("evict", key))

    def keys(self, what: str, graphs: set | None = None) -> list:
        """Keys compiled or evicted, in order; with ``graphs``, only those of these graph ids
        (compiled mode: programs other tests left in the cache may go first)."""
        return [k for w, k in self.events if w == what and (graphs is None or k[0] in graphs)]


@pytest.fixture
def log_eager():
    probe = _Log("eager")
    probes.subscribe(probe)
    yield probe
    probes.unsubscribe(probe)


@pytest.fixture
def log_compiled():
    probe = _Log("compiled")
    probes.subscribe(probe)
    yield probe
    probes.unsubscribe(probe)


def _counts(name: str):
    return next(c for c in cache_counts() if c.name == name)


# -- the LRU itself ----------------------------------------------------------------------


def test_lru_drops_the_least_recently_used_and_counts_it():
    dropped = []
    cache = LruCache("test lru", lambda: 2, on_evict=lambda k, v: dropped.append((k, v)))
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert dropped == [("b", 2)]
    assert cache.keys() == ["a", "c"]
    cache.get("a")
    cache.put("d", 4)
    assert dropped == [("b", 2), ("c", 3)]
    assert cache.counts().evicted == 2 and cache.counts().entries == 2
    # removing on purpose is not an eviction
    assert cache.pop("a") == 1 and cache.clear() == [("d", 4)]
    assert cache.counts().evicted == 2 and len(cache) == 0


def test_lru_by_use_counts_reads_recency_when_an_entry_must_go():
    """With ``uses``, lookups do not reorder: an entry used since the cache last looked
    (its count grew past the use it was put for) is passed over once, the oldest unused
    one goes."""
    calls = {}
    cache = LruCache("test counted lru", lambda: 3, uses=lambda k, v: calls[k])
    for k in "abc":  # compile, cache, call: each used once, as it was put for
        calls[k] = 0
        cache.put(k, k)
        calls[k] += 1
    calls["a"] += 1  # "a" found again through the plain lookup
    assert cache.lookup("a") == "a" and cache.keys() == ["a", "b", "c"]
    calls["d"] = 0
    cache.put("d", "d")
    assert cache.keys() == ["c", "a", "d"]  # "b" went; "a" moved to the recent end
    calls["d"] += 1
    calls["e"] = 0
    cache.put("e", "e")  # nothing used since: the oldest goes
    calls["e"] += 1
    assert cache.keys() == ["a", "d", "e"]
    for k in "ade":  # all used again: each passed over once, then the oldest goes
        calls[k] += 1
    calls["f"] = 0
    cache.put("f", "f")
    assert cache.keys() == ["d", "e", "f"] and cache.counts().evicted == 3


def test_lru_by_weight_keeps_the_total_within_the_bound():
    cache = LruCache("test weighted lru", lambda: 10, weigh=len)
    cache.put("a", "xxxx")
    cache.put("b", "yyyy")
    cache.put("c", "zzzz")  # 12 > 10: "a" goes
    assert cache.keys() == ["b", "c"] and cache.counts().weight == 8
    cache.put("huge", "w" * 11)  # heavier than the whole bound: not kept, nothing dropped for it
    assert cache.keys() == ["b", "c"] and cache.counts().evicted == 1


def test_lru_bound_is_read_on_each_insertion():
    limit = [3]
    cache = LruCache("test moving bound", lambda: limit[0])
    for k in "abc":
        cache.put(k, k)
    limit[0] = 1
    cache.put("d", "d")
    assert cache.keys() == ["d"] and cache.counts().evicted == 3


# -- eager executables -------------------------------------------------------------------


def test_eager_cache_evicts_oldest_and_recompiles_it(monkeypatch, log_eager):
    eager.clear_cache()
    monkeypatch.setattr(config, "eager_cache_size", 3)
    before = _counts("eager executables").evicted
    inputs = [torch.randn(n, 3) for n in range(1, 5)]
    for x in inputs:  # four keys of one op: the fourth pushes out the first
        torch.testing.assert_close(torch.sin(x.to("tpu")).cpu(), torch.sin(x))
    compiled_keys = log_eager.keys("compile")
    assert len(compiled_keys) == 4
    assert log_eager.keys("evict") == [compiled_keys[0]]
    assert len(eager.cache_stats()) == 3
    assert _counts("eager executables").evicted == before + 1

    # the evicted key compiles again (a compile like any other) and pushes out the next oldest
    torch.testing.assert_close(torch.sin(inputs[0].to("tpu")).cpu(), torch.sin(inputs[0]))
    assert log_eager.keys("compile")[4:] == [compiled_keys[0]]
    assert log_eager.keys("evict") == [compiled_keys[0], compiled_keys[1]]

    # a hit marks its key used: the least recently used one goes next, not the oldest
    torch.sin(inputs[2].to("tpu"))  # compiled_keys[2] hit
    torch.sin(torch.randn(9, 3).to("tpu"))
    assert log_eager.keys("evict")[-1] == compiled_keys[3]
    eager.clear_cache()


def test_an_eviction_forgets_only_its_own_signatures(monkeypatch):
    """A full cache evicts at each new compile: the signatures (and the donating program) of
    the executables still cached stay, and the evicted one's signature compiles again."""
    eager.clear_cache()
    monkeypatch.setattr(config, "eager_cache_size", 3)
    x = torch.arange(6.0).to("tpu")
    for _ in range(4):  # hot: an in-place signature donates from its third call on
        x.mul_(2.0)
    cos = eager.plan_for(torch.ops.aten.cos.default)
    torch.cos(torch.ones(2).to("tpu"))
    assert cos.fast  # (the signature is kept only after its executable's first call)
    mul = eager.plan_for(torch.ops.aten.mul_.Tensor)
    donor = mul.donors.get(next(iter(mul.fast)))
    assert donor
    for n in range(3, 7):  # each new key pushes one out: the cold cos keys go, mul_ stays hot
        torch.cos(torch.ones(n).to("tpu"))
        x.mul_(2.0)
    assert next(iter(mul.donors.values())) is donor  # kept, not compiled again
    cached = {id(e) for e in eager._cache.values()}
    assert len(cos.fast) == 2 and all(id(e) in cached for e in cos.fast.values())
    torch.testing.assert_close(x.cpu(), torch.arange(6.0) * 2.0 ** 8)
    eager.clear_cache()


def test_eager_eviction_keeps_float64_counts(monkeypatch):
    eager.clear_cache()
    monkeypatch.setattr(config, "eager_cache_size", 1)
    base = eager.float64_ops().get("cos", 0)
    x = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(torch.cos(x.to("tpu")).cpu(), torch.cos(x))
    torch.sin(torch.randn(4).to("tpu"))  # pushes the float64 cos out
    assert "cos" not in {s.op for s in eager.cache_stats()}
    assert eager.float64_ops()["cos"] == base + 1
    eager.clear_cache()


# -- compiled programs -------------------------------------------------------------------


def test_compiled_cache_evicts_oldest_program_and_recompiles_it(monkeypatch, log_compiled):
    monkeypatch.setattr(config, "compiled_cache_size", 1)
    before = _counts("compiled programs").evicted

    def f(x):
        return torch.tanh(x) * 3 + 1

    cf = torch.compile(f, backend="tpu_debug", dynamic=False)
    a, b = torch.randn(4, 5), torch.randn(6, 5)
    torch.testing.assert_close(cf(a.to("tpu")).cpu(), f(a))
    first = log_compiled.keys("compile")
    assert len(first) == 1
    torch.testing.assert_close(cf(b.to("tpu")).cpu(), f(b))  # a second program: the first goes
    mine = {k[0] for k in log_compiled.keys("compile")}
    assert log_compiled.keys("evict", mine) == first
    assert _counts("compiled programs").evicted >= before + 1
    graph_ids = {g["graph_id"] for g in compiled.graph_stats()}
    assert first[0][0] not in graph_ids, "a graph with no program left is not listed"

    # dynamo still holds the first graph: its call compiles the program again
    torch.testing.assert_close(cf(a.to("tpu")).cpu(), f(a))
    assert log_compiled.keys("compile")[-1] == first[0]
    assert len(log_compiled.keys("evict", mine)) == 2
    assert first[0][0] in {g["graph_id"] for g in compiled.graph_stats()}
    assert len(compiled._programs) == 1


def test_compiled_programs_of_one_graph_share_the_bound(monkeypatch, log_compiled):
    """Dynamic shapes: one graph, one program per input signature, all under one bound."""
    monkeypatch.setattr(config, "compiled_cache_size", 2)

    def f(x):
        return x.sum(0) * 2

    cf = torch.compile(f, backend="tpu_debug", dynamic=True)
    # distinct sizes from the start: dynamo gives equal sizes one symbol (3x3 would tie the dims)
    xs = [torch.randn(n, 7) for n in (3, 4, 5, 3)]
    for x in xs:
        torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x))
    keys = log_compiled.keys("compile")
    assert len({k[0] for k in keys}) == 1, "one dynamic graph"
    # three signatures (3, 4, 5 rows) into a bound of two: the 3-row program went and came back
    assert len(keys) == 4 and keys[3] == keys[0]
    assert log_compiled.keys("evict", {keys[0][0]}) == [keys[0], keys[1]]


# -- view index arrays -------------------------------------------------------------------


def test_index_cache_is_bounded_by_bytes(monkeypatch):
    monkeypatch.setattr(config, "index_cache_bytes", 4096)
    counts = _counts("view index arrays")
    base = tpu_tensor._index_cache.counts().evicted
    host = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)
    dev = host.to("tpu")
    for k in range(1, 9):  # strided views of several geometries, each read to the host
        view, ref = dev[::k, 1::2], host[::k, 1::2]
        torch.testing.assert_close(view.cpu(), ref)
    counts = tpu_tensor._index_cache.counts()
    assert counts.weight <= 4096
    assert counts.evicted > base
    # an index array larger than the whole bound is built for its use, not kept
    big = dev.t()[:, ::3]
    torch.testing.assert_close(big.cpu(), host.t()[:, ::3])
    assert all(idx.nbytes <= 4096 for idx in tpu_tensor._index_cache.values())


def test_cached_index_arrays_are_read_only():
    idx = tpu_tensor._indices((3, 2), (1, 3), 0)
    with pytest.raises(ValueError, match="read-only"):
        idx[0, 0] = 5


# -- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize("field", ["eager_cache_size", "compiled_cache_size", "index_cache_bytes"])
def test_cache_bounds_come_from_the_environment(field):
    var = f"TPU_DEBUG_{field.upper()}"
    assert getattr(RuntimeConfig.from_env({var: "12"}), field) == 12
    with pytest.raises(ConfigError, match=rf"^{var}='0' is not a positive integer; use a count such as 1024$"):
        RuntimeConfig.from_env({var: "0"})
    with pytest.raises(ValueError, match=rf"^{var}='many' is not a positive integer"):
        RuntimeConfig.from_env({var: "many"})


def test_cache_counts_are_public():
    names = {c.name for c in tpu_debug.runtime.cache_counts()}
    assert {"eager executables", "compiled programs", "compiled debug variants", "view index arrays"} <= names


def test_lru_iterates_and_deletes_like_a_dict():
    cache = LruCache("test dict protocol", lambda: 5)
    for k in "abc":
        cache.put(k, k)
    for k in cache:  # a snapshot of the keys: deleting meanwhile is safe
        if k != "b":
            del cache[k]
    assert cache.keys() == ["b"] and cache.counts().evicted == 0
    with pytest.raises(KeyError, match="'a'"):
        del cache["a"]
