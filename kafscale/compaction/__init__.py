"""Log compaction (cleanup.policy=compact): the latest record of every key, kept for ever (docs/compaction.md).

policy: when a partition is due and what is cleanable; keymap: each key's latest offset in bounded memory;
records: a batch's records and a batch rebuilt from the ones kept; cleaner: one pass, pure but for its reads and
writes. The broker drives it (kafscale.broker.cleaning): it picks due partitions, runs passes off the event loop,
and commits each pass's segments in place of the old ones, fenced by the owner epoch.
"""
