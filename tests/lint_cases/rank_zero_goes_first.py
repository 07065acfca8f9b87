""""Rank 0 goes first" written wrong: two rank-dependent barriers that do not pair up, because
something between them communicates or leaves, or their conditions leave a rank out."""

import torch.distributed as dist


def reduce_between(rank, x):
    if rank != 0:
        dist.barrier()  # expect: RDL101
    dist.all_reduce(x)  # rank 0 reduces before the barrier, the others after it
    if rank == 0:
        dist.barrier()  # expect: RDL101


def rank_one_waits_for_nobody(rank):
    if rank > 1:
        dist.barrier()  # expect: RDL101
    prepare()
    if rank == 0:
        dist.barrier()  # expect: RDL101


def return_between(rank, path):
    if rank != 0:
        dist.barrier()  # expect: RDL101
    if not path:
        return
    if rank == 0:
        dist.barrier()  # expect: RDL101


def one_barrier_too_many(rank):
    if rank != 0:
        dist.barrier()
    prepare()
    if rank == 0:
        dist.barrier()
    if rank == 0:
        dist.barrier()  # expect: RDL101


def meet(x):
    dist.all_reduce(x)


def package_call_between(x):
    rank = dist.get_rank()
    if rank != 0:
        dist.barrier()  # expect: RDL101
    meet(x)
    if rank == 0:
        dist.barrier()  # expect: RDL101


def guarded_once(rank, initialized):
    if initialized and rank != 0:
        dist.barrier()  # expect: RDL101
    prepare()
    if rank == 0:  # without the guard: rank 0 waits where the others may not
        dist.barrier()  # expect: RDL101


def guard_on_the_rank(rank):
    if rank < 4 and rank != 0:  # ranks 4 and up meet neither barrier
        dist.barrier()  # expect: RDL101
    prepare()
    if rank < 4 and rank == 0:
        dist.barrier()  # expect: RDL101


def other_groups(rank, group):
    if rank != 0:
        dist.barrier(group=group)  # expect: RDL101
    prepare()
    if rank == 0:
        dist.barrier()  # expect: RDL101


def callback_in_the_else(fn):
    if dist.get_rank() != 0:
        dist.barrier()  # expect: RDL101
    else:
        fn()  # an else that calls something: no turn
    if dist.get_rank() == 0:
        dist.barrier()  # expect: RDL101


def callback_between(fn):
    if dist.get_rank() != 0:
        dist.barrier()
    fn()  # rank 0 runs it before its barrier, the others after theirs
    if dist.get_rank() == 0:
        dist.barrier()


def guard_on_a_parameter(flag):
    if flag and dist.get_rank() != 0:
        dist.barrier()  # expect: RDL101
    prepare()
    if flag and dist.get_rank() == 0:
        dist.barrier()


def rebound_between(rank):
    if rank != 0:
        dist.barrier()  # expect: RDL101
    rank = (rank + 1) % dist.get_world_size()
    if rank == 0:
        dist.barrier()  # expect: RDL101


def computed_from_a_rank():
    offset = dist.get_rank() - 1  # -1 on rank 0: it meets neither barrier
    if offset > 0:
        dist.barrier()  # expect: RDL101
    prepare()
    if offset == 0:
        dist.barrier()  # expect: RDL101


EVENS = dist.new_group([0, 2])


def wait_for_the_evens():
    dist.barrier(group=EVENS)


def helper_on_a_subgroup(rank):
    if rank != 0:
        wait_for_the_evens()  # expect: RDL101
    prepare()
    if rank == 0:
        dist.barrier()  # expect: RDL101


def prepare():
    return [0]


def main(x):
    rank = dist.get_rank()
    reduce_between(rank, x)
    rank_one_waits_for_nobody(rank)
    return_between(rank, "data")
    one_barrier_too_many(rank)
    package_call_between(x)
    guarded_once(rank, dist.is_initialized())
    guard_on_the_rank(rank)
    other_groups(rank, dist.new_group([0, 1]))
    callback_between(lambda: dist.all_reduce(x))  # expect: RDL104
    callback_in_the_else(lambda: dist.all_reduce(x))  # expect: RDL104
    guard_on_a_parameter(rank == 0)
    rebound_between(rank)
    computed_from_a_rank()
    helper_on_a_subgroup(rank)
