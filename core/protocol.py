"""What server and clients agree on, for every method: record names, config fields, metric
names, phases and error codes (a method's own wire names are in its declaration). Kept free
of Flower so both sides (and tests) import it without a framework.
"""

from headway.core.methods import FEDLOG_RECORDS, FEDPFT_RECORDS, FEDPROF_RECORDS, FEDPROTO_RECORDS, LG_FEDAVG_RECORDS

ARRAYS = "arrays"  # ArrayRecord: a model, a head, or a method's payload
CONFIG = "config"  # ConfigRecord: round, phase and per-round settings
METRICS = "metrics"  # MetricRecord: counts and measurements
SCORES = "scores"  # MetricRecord of a train reply under client-evaluation=with-next-train: the received model's test scores

# config fields
ROUND = "server-round"
PHASE = "phase"
BODY = "body"  # config field of a registration or upload reply: the client's body architecture
DATA_PROFILE = "data-profile"  # config field of a dataset=local node's describe/registration reply: what its data holds (JSON, no rows)
DATA_SCHEMA = "data-schema"  # config field of a dataset=local registration query: the run's agreed classes and encoding (JSON)
CLIENT_INDEX = "client-index"  # config field of a dataset=local registration query: the index the server gives the node
LINEAGE = "lineage"  # config field (str) of every registration query: the run's key (a random token kept across resumes), which keys the nodes' saved state

# metric fields
NUM_EXAMPLES = "num-examples"
PARTITION_ID = "partition-id"
CORRECT = "correct"
LOSS = "loss"
SQUARED_ERROR = "squared-error"

# error codes clients put in error replies
ERROR_BAD_INPUT = 4001  # the server's message could not be used (wrong layers, unknown phase)
ERROR_CLIENT = 4002  # the local procedure failed
ERROR_UNREGISTERED = 4003  # a dataset=local node holds no schema (it restarted): the server registers it again

# phases: what an exchange is for (config field PHASE; also the byte meter's keys)
PHASE_REGISTER = "register"  # before round 1: every client states its partition id and body
PHASE_DESCRIBE = "describe"  # dataset=local, before the strategy exists: every node describes its data (classes, columns, counts)
PHASE_TRAIN = "train"
PHASE_EVALUATE = "evaluate"

# Wire names only one method uses live in its declaration (core/methods.py, ``records``). These
# aliases keep the old names importable until the strategies and procedures read them there.
ETA = FEDLOG_RECORDS.eta
STATS = FEDLOG_RECORDS.stats
STATS_SUM = FEDLOG_RECORDS.stats_sum
STATS_ROWS = FEDLOG_RECORDS.stats_rows
PHASE_STATS = FEDLOG_RECORDS.phase_stats
PHASE_UPLOAD = LG_FEDAVG_RECORDS.phase_upload
PROFILE = FEDPROF_RECORDS.profile
PHASE_PROFILE = FEDPROF_RECORDS.phase_profile
PROTOTYPES = FEDPROTO_RECORDS.prototypes
CLASS_COUNTS = FEDPROTO_RECORDS.class_counts
GMM_CLASSES = FEDPFT_RECORDS.gmm_classes
GMM_WEIGHTS = FEDPFT_RECORDS.gmm_weights
GMM_MEANS = FEDPFT_RECORDS.gmm_means
GMM_COVARIANCES = FEDPFT_RECORDS.gmm_covariances
HEAD_WEIGHT = FEDPFT_RECORDS.head_weight
HEAD_BIAS = FEDPFT_RECORDS.head_bias
PHASE_CHAIN = FEDPFT_RECORDS.phase_chain


def as_int(value: object) -> int:
    """A record or config field that this protocol makes a whole number, as an int (Flower types
    every field as any record value, lists and bytes included: those raise TypeError)."""
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


# Secure aggregation (core/secagg.py): a ConfigRecord SECAGG in a TRAIN message names the stage
# and what it needs; the train content rides with the collect stage. Each stage is an exchange
# of its own, metered under its phase.
SECAGG = "secagg"
SECAGG_STAGE = "stage"
STAGE_SETUP = "secagg-setup"  # -> keys: PK1, PK2, SEED_DIGEST
STAGE_SHARE = "secagg-share"  # IDS + PK1S + PK2S of the neighbours (itself included) -> IDS + CIPHERTEXTS
STAGE_COLLECT = "secagg-collect"  # IDS + CIPHERTEXTS relayed to it, SUM_NAMES, FRAC_BITS -> ARRAYS{MASKED}
STAGE_UNMASK = "secagg-unmask"  # ALIVE, DROPPED -> IDS + SHARES
SECAGG_THRESHOLD = "threshold"
PK1 = "pk1"
PK2 = "pk2"
PK1S = "pk1s"
PK2S = "pk2s"
SEED_DIGEST = "seed-digest"
IDS = "ids"
CIPHERTEXTS = "ciphertexts"
SHARES = "shares"
ALIVE = "alive"
DROPPED = "dropped"
SUM_NAMES = "sum-names"  # the arrays of the method's reply that are summed, in this order
SUM_ROW_WEIGHTS = "sum-row-weights"  # non-empty: the summed array of that name weighs the rows of the others (FedProto's counts)
SUM_UPDATE_NORM = "sum-update-norm"  # > 0: the summed arrays are n·(w − w_sent), L2-clipped to this norm, then n (model averaging)
FRAC_BITS = "frac-bits"
MASKED = "masked"  # uint64 (D,): the masked fixed-point vector
