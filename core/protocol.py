"""What server and clients agree on: record names, config fields and metric names.

Kept free of Flower so both sides (and tests) import it without a framework.
"""

ARRAYS = "arrays"  # ArrayRecord: a model, a head, or a method's payload
CONFIG = "config"  # ConfigRecord: round, phase and per-round settings
METRICS = "metrics"  # MetricRecord: counts and measurements

# config fields
ROUND = "server-round"
PHASE = "phase"

# metric fields every reply carries
NUM_EXAMPLES = "num-examples"
PARTITION_ID = "partition-id"
# evaluation metric fields
CORRECT = "correct"
ACCURACY = "accuracy"
LOSS = "loss"
SQUARED_ERROR = "squared-error"

# error codes clients put in error replies
ERROR_BAD_INPUT = 4001
ERROR_CLIENT = 4002

# phases (config field PHASE) beyond plain training and evaluation
PHASE_UPLOAD = "upload-model"  # LG-FedAvg new test: a client sends its whole local model once
# config field of an upload reply naming the client's body architecture
BODY = "body"

# FedProto payload arrays
PROTOTYPES = "prototypes"
CLASS_COUNTS = "class-counts"
