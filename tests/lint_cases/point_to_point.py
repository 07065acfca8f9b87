"""Point-to-point calls differ by rank by design; a collective beside them does not."""

import torch.distributed as dist


def exchange(t):
    rank = dist.get_rank()
    if rank == 0:
        dist.send(t, dst=1)
        dist.barrier()  # expect: RDL101
    else:
        dist.recv(t, src=0)
    ops = [dist.P2POp(dist.isend if rank == 0 else dist.irecv, t, 1 - rank)]
    if rank < 2:
        dist.batch_isend_irecv(ops)
