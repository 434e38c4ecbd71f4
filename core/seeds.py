"""Salts mixed with the run seed, one per random stream, so that the streams drawn from one
seed never coincide and adding a stream shifts no other. The values are part of every
result: change one and the runs it feeds change.

The streams listed here are shared or predate :func:`salt`; a method's own stream is declared in
its module as ``salt("<method>-<use>")``, so adding a method never edits this file."""

import hashlib


def salt(name: str) -> int:
    """A stream's salt derived from its name (a stable 32-bit hash, the same on every machine and
    Python version): ``salt("fedbabu-finetune")`` in the module that draws from that stream."""
    return int.from_bytes(hashlib.sha256(f"headway-stream:{name}".encode()).digest()[:4], "big")


# numpy streams: np.random.default_rng([seed, SALT])
DEVICES = 0x656E6572  # core/costmodel.py: the simulated clients' compute speeds and bandwidths
NOISE = 0x6E6F6973  # core/noise.py: which clients get low-quality data; client/env.py, as [seed, partition id, NOISE]: each one's noise
HOLDOUT = 0x686F6C64  # core/sources.py: the test rows held out of a source that has no test split
CLIENT_SIZES = 0x73697A65  # core/partition.py (client-size-mean/std): how many rows each client gets
SERVER_HOLDOUT = 104729  # core/partition.py (server-holdout): the rows the server keeps out of the clients' partitions
SAMPLING = 7919  # strategies/services.py: the server's reproducible draws of clients

# torch.manual_seed(seed + HEAD): a model's head, drawn after its body (seeded with the seed itself); core/models.py
HEAD = 1

# ClientEnv.init_seed with body-init=per-client: hashed with the seed and the partition id
PER_CLIENT_INIT = "init"

# ClientEnv.seed_for(round, SALT): one client's streams within a round (hashed with the seed, partition id and round)
BATCHES = 0  # local training's batch order and crops (every method's training)
FEDREP_HEAD = 2  # FedRep: the head's epochs, before the body's (BATCHES)
FEDPFT_MIXTURES = 0x676D6D  # FedPFT: the EM fit of a client's class mixtures
FEDPFT_LOCAL_HEAD = 1  # FedPFT chain: a client's head on its own features
FEDPFT_SYNTHESIS = 2  # FedPFT chain: the draws from the mixtures relayed to it
FEDPFT_CHAIN_HEAD = 3  # FedPFT chain: the head on its own and the synthetic features
