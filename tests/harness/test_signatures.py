"""What the ranks of a group must agree on, collective by collective (``signatures.py``), and
how a subgroup's verdict is reached from its members' records (``checks/fingerprint.py``).
Two calls agree when their fingerprints are equal; what the documentation lets differ between
ranks stays out of the fingerprint."""

import torch
import torch.distributed as dist

from refddp.testing.checks.fingerprint import _verdict
from refddp.testing.checks.signatures import describe, fingerprint, pairing, unpaired


def ones(*shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype)


def test_all_gather_compares_the_list_with_its_dtypes_and_the_own_part_by_dtype_only():
    parts = [ones(1), ones(2)]  # parts of a different size on each rank: allowed
    rank0 = fingerprint("all_gather", {"tensor_list": parts, "tensor": ones(1)})
    rank1 = fingerprint("all_gather", {"tensor_list": parts, "tensor": ones(2)})
    assert rank0 == rank1
    as_int = fingerprint("all_gather", {"tensor_list": parts, "tensor": ones(2, dtype=torch.int32)})
    assert as_int != rank1, "a rank's own part in another dtype"
    ints = [ones(1, dtype=torch.int32), ones(2, dtype=torch.int32)]
    assert fingerprint("all_gather", {"tensor_list": ints, "tensor": ones(1)}) != rank0, \
        "the same shapes in another dtype (the issue: bytes reinterpreted)"  # fmt: skip


def test_reduce_scatter_compares_the_list_and_the_op_and_the_own_part_by_dtype_only():
    parts = [ones(1), ones(2)]
    rank0 = fingerprint("reduce_scatter", {"output": ones(1), "input_list": parts, "op": "SUM"})
    rank1 = fingerprint("reduce_scatter", {"output": ones(2), "input_list": parts, "op": "SUM"})
    assert rank0 == rank1
    assert fingerprint("reduce_scatter", {"output": ones(2, dtype=torch.float64),
                                          "input_list": parts, "op": "SUM"}) != rank1  # fmt: skip


def test_broadcast_compares_element_counts_not_shapes():
    call = lambda t: fingerprint("broadcast", {"tensor": t, "src": 0})  # noqa: E731
    assert call(ones(2, 3)) == call(ones(6)), "torch documents the same number of elements"
    assert call(ones(2, 3)) != call(ones(5))
    assert call(ones(6)) != call(ones(6, dtype=torch.int32))
    assert call(ones(6)) != fingerprint("broadcast", {"tensor": ones(6), "src": 1})


def test_reductions_compare_shapes_dtypes_and_ops():
    call = lambda t, op="SUM": fingerprint("all_reduce", {"tensor": t, "op": op})  # noqa: E731
    assert call(ones(2, 3)) != call(ones(3, 2))
    assert call(ones(2)) != call(ones(2, dtype=torch.int32))
    assert call(ones(2)) != call(ones(2), "MAX")


def test_single_tensor_forms_let_each_rank_concatenate_or_stack_its_whole_tensor():
    gather = lambda out, inp: fingerprint("all_gather_into_tensor",  # noqa: E731
                                          {"output_tensor": out, "input_tensor": inp})  # fmt: skip
    assert gather(ones(4, 3), ones(2, 3)) == gather(ones(2, 2, 3), ones(2, 3))
    assert gather(ones(4), ones(1, 2)) != gather(ones(4), ones(2)), "inputs: the same size"
    scatter = lambda out, inp: fingerprint("reduce_scatter_tensor",  # noqa: E731
                                           {"output": out, "input": inp, "op": "SUM"})  # fmt: skip
    assert scatter(ones(2, 3), ones(4, 3)) == scatter(ones(2, 3), ones(2, 2, 3))
    assert scatter(ones(2, 3), ones(4, 3)) != scatter(ones(3, 2), ones(4, 3))


def test_the_new_names_of_a_collective_and_its_defaults_agree():
    t = ones(2)
    assert fingerprint("all_gather_single", {"output_tensor": ones(4), "input_tensor": t}) == \
        fingerprint("all_gather_into_tensor", {"output_tensor": ones(4), "input_tensor": t})  # fmt: skip
    # On the default group a group rank is the global rank.
    assert fingerprint("broadcast", {"tensor": t, "group_src": 1, "src": None}) == \
        fingerprint("broadcast", {"tensor": t, "src": 1})  # fmt: skip


def test_object_collectives_compare_list_lengths_and_roots_not_objects():
    assert fingerprint("broadcast_object_list", {"object_list": [1, 2], "src": 0}) == \
        fingerprint("broadcast_object_list", {"object_list": [None, None], "src": 0})  # fmt: skip
    assert fingerprint("broadcast_object_list", {"object_list": [1, 2], "src": 0}) != \
        fingerprint("broadcast_object_list", {"object_list": [None], "src": 0})  # fmt: skip
    assert fingerprint("gather_object", {"obj": "a", "dst": 0}) == \
        fingerprint("gather_object", {"obj": "a much longer object", "dst": 0})  # fmt: skip


def test_all_to_all_split_sizes_are_paired_across_ranks_not_compared():
    row = lambda splits: {"output": ones(3, 2), "input": ones(3, 2),  # noqa: E731
                          "input_split_sizes": splits, "output_split_sizes": splits}  # fmt: skip
    assert fingerprint("all_to_all_single", row([1, 2])) == fingerprint("all_to_all_single",
                                                                        row([2, 1]))  # fmt: skip
    assert fingerprint("all_to_all_single", row([1, 2])) != fingerprint(
        "all_to_all_single", {**row([1, 2]), "input": ones(3, 3)}), "rows of another width"  # fmt: skip
    assert pairing("all_to_all_single", row([1, 2]), 2) == ([1, 2], [1, 2])
    assert pairing("all_to_all_single", {"output": ones(4), "input": ones(4)}, 2) == ([2, 2], [2, 2])
    lists = {"output_tensor_list": [ones(1), ones(3)], "input_tensor_list": [ones(2), ones(1)]}
    assert pairing("all_to_all", lists, 2) == ([2, 1], [1, 3])
    # Rank 0 sends rank 1 two rows; rank 1 expects one from it.
    assert unpaired([[1, 2], [1, 1]], [[1, 1], [1, 1]], [0, 1]) == \
        "rank 0 sends 2 to rank 1, which expects 1"  # fmt: skip
    # Rank 0 sends rank 1 two, rank 1 sends rank 0 three: each expects what the other sends.
    assert unpaired([[1, 2], [3, 1]], [[1, 3], [2, 1]], [0, 1]) == ""


def test_a_subgroups_verdict_names_each_member_and_what_differs():
    def record(fp, text, pairs=None):
        return [fp, text, 1, pairs]

    same = [record("f", "all_reduce((2,):float32, SUM)")] * 2
    assert _verdict(same, [1, 3]) == ""
    differ = [record("f", "all_reduce((2,):float32, SUM)"), record("g", "all_reduce((2,):int32, SUM)")]
    assert _verdict(differ, [1, 3]) == (
        "Detected mismatch between collectives on ranks: rank 1 is running #1 "
        "all_reduce((2,):float32, SUM); rank 3 is running #1 all_reduce((2,):int32, SUM)"
    )
    unpaired_sizes = [record("a", "all_to_all_single(...)", ([1, 2], [1, 1])),
                      record("a", "all_to_all_single(...)", ([1, 1], [1, 1]))]  # fmt: skip
    assert _verdict(unpaired_sizes, [1, 3]).endswith(": rank 1 sends 2 to rank 3, which expects 1")


def test_a_call_is_described_with_every_tensors_shape_and_dtype():
    assert describe("all_gather", {"tensor_list": [ones(2), ones(2)], "tensor": ones(2)}) == \
        "all_gather([2x(2,):float32], (2,):float32)"  # fmt: skip
    assert describe("all_gather", {"tensor_list": [ones(1), ones(2, dtype=torch.int32)]}) == \
        "all_gather([(1,):float32, (2,):int32])"  # fmt: skip
    assert describe("all_reduce", {"tensor": ones(4), "op": dist.ReduceOp.SUM}) == \
        "all_reduce((4,):float32, SUM)"  # fmt: skip
