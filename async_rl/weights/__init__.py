"""The weight-sync group: the process group, apart from the trainers' DeepSpeed group, over which trainer rank 0
broadcasts trained weights to the inference actors (NCCL between GPUs of their own, gloo otherwise).

- ``group``: the group itself (``WeightSyncGroup``: join, broadcast, receive; its collectives off the event loop)
- ``rendezvous``: free ports, interfaces and the ``TCPStore`` both process groups meet through
- ``signature``: (name, shape, dtype) per tensor, compared before the first broadcast
- ``transport``: which backend the members' devices allow
"""
