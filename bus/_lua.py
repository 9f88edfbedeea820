"""The bus's Lua scripts (the ``.lua`` files beside this module document their keys)."""

from __future__ import annotations

from bus._scripts import Script

PUBLISH = Script.load("bus", "publish")
PUBLISH_BATCH = Script.load("bus", "publish_batch")
ACK = Script.load("bus", "ack")
HEARTBEAT = Script.load("bus", "heartbeat")
DEDUPE_CLAIM = Script.load("bus", "dedupe_claim")
READ_CLAIM = Script.load("bus", "read_claim")
RECORD = Script.load("bus", "record")
COMPLETE_BATCH = Script.load("bus", "complete_batch")
FAIL = Script.load("bus", "fail")
TRIM = Script.load("bus", "trim")
DELETE_CONSUMER = Script.load("bus", "delete_consumer")
