"""The bus's engine plumbing, for the packages built on it (``saga``, ``relay``, the CLI).

Not what a service using the bus needs (that is :mod:`bus`), but what an engine on top of
it does: run its own Lua scripts through the bus's function libraries
(:class:`Script`, :func:`run_batch`), build keys under a stream's hash tag
(:func:`tagged_key`), map redis-py's errors the one way the bus does
(:func:`redis_errors`), write replies and envelopes the bus's consumers read, sign for
principals, and stop at the named crash points the fault tests arm. Names here may change
with the engine; ``tests/test_public_api.py`` pins them so that a change is deliberate.
"""

from bus._auth import KEYRING_ENV, VERIFY_ENV, check_key_id, encode_keyrings, issue, role_of, stream_audience
from bus._backoff import Backoff
from bus._batcher import Batcher
from bus._client import is_embedded
from bus._cluster import is_cluster, owner_of, primaries, slot_of
from bus._crash import (
    AFTER_CLAIM,
    AFTER_COMMIT_BEFORE_ACK,
    AFTER_XADD_BEFORE_MARK_SENT,
    BEFORE_COMMIT,
    crash_point,
)
from bus._crash import ENV as CRASH_ENV
from bus._epoch import EPOCH_COPY_PATTERN
from bus._errors import redis_errors
from bus._log import get_logger
from bus._outcomes import encode_result, reply_envelope, reply_to_command
from bus._ride_through import RideThrough, rides_through
from bus._scripts import (
    CommandCall,
    Library,
    Script,
    ScriptCall,
    acks_of,
    delete_library,
    library,
    load_libraries,
    loaded_libraries,
    run_batch,
    shared_helpers,
)
from redsaga.streams import tagged_key

__all__ = [
    "AFTER_CLAIM",
    "AFTER_COMMIT_BEFORE_ACK",
    "AFTER_XADD_BEFORE_MARK_SENT",
    "BEFORE_COMMIT",
    "CRASH_ENV",
    "EPOCH_COPY_PATTERN",
    "KEYRING_ENV",
    "VERIFY_ENV",
    "Backoff",
    "Batcher",
    "CommandCall",
    "Library",
    "RideThrough",
    "Script",
    "ScriptCall",
    "acks_of",
    "check_key_id",
    "crash_point",
    "delete_library",
    "encode_keyrings",
    "encode_result",
    "get_logger",
    "is_cluster",
    "is_embedded",
    "issue",
    "library",
    "load_libraries",
    "loaded_libraries",
    "owner_of",
    "primaries",
    "redis_errors",
    "reply_envelope",
    "reply_to_command",
    "rides_through",
    "role_of",
    "run_batch",
    "shared_helpers",
    "slot_of",
    "stream_audience",
    "tagged_key",
]
