"""The actors, one role each (ARCHITECTURE.md, The actors): trainer ranks (``trainer``, the training
step, with one mixin per other job: ``trainer_setup``, ``trainer_intake``, ``trainer_sync``, ``trainer_checkpoints``,
``trainer_supervised``), inference (``inference``), rollout workers (``rollout_worker`` over ``env_slots``,
``policy_client``, ``shared_slab``, ``columnar_gae``, ``groups``, ``backpressure``), the replay buffer
(``replay_buffer`` over ``replay_storage``, ``replay_draws``, ``replay_log``), evaluation and stats; ``peers``
finds an actor's peers by name, ``prefetch`` overlaps a trainer's next draw with its epoch."""
