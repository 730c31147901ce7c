from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KeyStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[KeyStatus]
    NOT_FOUND: _ClassVar[KeyStatus]
    ALREADY_EXISTS: _ClassVar[KeyStatus]
    NOT_READY: _ClassVar[KeyStatus]
    NO_SPACE: _ClassVar[KeyStatus]
    INVALID_KEY: _ClassVar[KeyStatus]
    HAS_LEASE: _ClassVar[KeyStatus]
    INVALID_ARGUMENT: _ClassVar[KeyStatus]
    STALE_PUT: _ClassVar[KeyStatus]
    NO_REPLICA: _ClassVar[KeyStatus]
    FENCED: _ClassVar[KeyStatus]
    QUOTA_EXCEEDED: _ClassVar[KeyStatus]

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    DRAM: _ClassVar[Tier]
    NVME: _ClassVar[Tier]

class Pin(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PIN_NONE: _ClassVar[Pin]
    PIN_SOFT: _ClassVar[Pin]
    PIN_HARD: _ClassVar[Pin]
OK: KeyStatus
NOT_FOUND: KeyStatus
ALREADY_EXISTS: KeyStatus
NOT_READY: KeyStatus
NO_SPACE: KeyStatus
INVALID_KEY: KeyStatus
HAS_LEASE: KeyStatus
INVALID_ARGUMENT: KeyStatus
STALE_PUT: KeyStatus
NO_REPLICA: KeyStatus
FENCED: KeyStatus
QUOTA_EXCEEDED: KeyStatus
TIER_UNSPECIFIED: Tier
DRAM: Tier
NVME: Tier
PIN_NONE: Pin
PIN_SOFT: Pin
PIN_HARD: Pin

class Segment(_message.Message):
    __slots__ = ("segment_id", "node_id", "host", "worker_address", "base_address", "size", "rkey", "tier", "persistent", "shared_memory", "checked_address", "tenant", "map_capability", "space_reserved")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BASE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    RKEY_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    CHECKED_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MAP_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    SPACE_RESERVED_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    node_id: str
    host: str
    worker_address: bytes
    base_address: int
    size: int
    rkey: bytes
    tier: Tier
    persistent: bool
    shared_memory: SharedMemory
    checked_address: str
    tenant: str
    map_capability: bytes
    space_reserved: bool
    def __init__(self, segment_id: _Optional[str] = ..., node_id: _Optional[str] = ..., host: _Optional[str] = ..., worker_address: _Optional[bytes] = ..., base_address: _Optional[int] = ..., size: _Optional[int] = ..., rkey: _Optional[bytes] = ..., tier: _Optional[_Union[Tier, str]] = ..., persistent: _Optional[bool] = ..., shared_memory: _Optional[_Union[SharedMemory, _Mapping]] = ..., checked_address: _Optional[str] = ..., tenant: _Optional[str] = ..., map_capability: _Optional[bytes] = ..., space_reserved: _Optional[bool] = ...) -> None: ...

class SharedMemory(_message.Message):
    __slots__ = ("pid", "fd", "inode", "device", "boot_id", "socket", "direct_io")
    PID_FIELD_NUMBER: _ClassVar[int]
    FD_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    SOCKET_FIELD_NUMBER: _ClassVar[int]
    DIRECT_IO_FIELD_NUMBER: _ClassVar[int]
    pid: int
    fd: int
    inode: int
    device: int
    boot_id: str
    socket: str
    direct_io: bool
    def __init__(self, pid: _Optional[int] = ..., fd: _Optional[int] = ..., inode: _Optional[int] = ..., device: _Optional[int] = ..., boot_id: _Optional[str] = ..., socket: _Optional[str] = ..., direct_io: _Optional[bool] = ...) -> None: ...

class StoredObject(_message.Message):
    __slots__ = ("key", "offset", "size", "crc32c", "generation", "replicas", "unconfirmed")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    UNCONFIRMED_FIELD_NUMBER: _ClassVar[int]
    key: str
    offset: int
    size: int
    crc32c: int
    generation: int
    replicas: int
    unconfirmed: bool
    def __init__(self, key: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., crc32c: _Optional[int] = ..., generation: _Optional[int] = ..., replicas: _Optional[int] = ..., unconfirmed: _Optional[bool] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("segment_id", "address", "capability")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    address: int
    capability: bytes
    def __init__(self, segment_id: _Optional[str] = ..., address: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class CapabilityKey(_message.Message):
    __slots__ = ("key_id", "secret")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    key_id: int
    secret: bytes
    def __init__(self, key_id: _Optional[int] = ..., secret: _Optional[bytes] = ...) -> None: ...

class CapabilityKeys(_message.Message):
    __slots__ = ("keys", "term", "max_skew_ms")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MAX_SKEW_MS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[CapabilityKey]
    term: int
    max_skew_ms: int
    def __init__(self, keys: _Optional[_Iterable[_Union[CapabilityKey, _Mapping]]] = ..., term: _Optional[int] = ..., max_skew_ms: _Optional[int] = ...) -> None: ...

class MountSegmentRequest(_message.Message):
    __slots__ = ("segment", "objects", "remount", "silent_ms", "incarnation", "more", "continued")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    REMOUNT_FIELD_NUMBER: _ClassVar[int]
    SILENT_MS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    CONTINUED_FIELD_NUMBER: _ClassVar[int]
    segment: Segment
    objects: _containers.RepeatedCompositeFieldContainer[StoredObject]
    remount: bool
    silent_ms: int
    incarnation: str
    more: bool
    continued: bool
    def __init__(self, segment: _Optional[_Union[Segment, _Mapping]] = ..., objects: _Optional[_Iterable[_Union[StoredObject, _Mapping]]] = ..., remount: _Optional[bool] = ..., silent_ms: _Optional[int] = ..., incarnation: _Optional[str] = ..., more: _Optional[bool] = ..., continued: _Optional[bool] = ...) -> None: ...

class MountSegmentResponse(_message.Message):
    __slots__ = ("dropped_keys", "capability_keys", "node_ttl_ms", "lone_master")
    DROPPED_KEYS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_KEYS_FIELD_NUMBER: _ClassVar[int]
    NODE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    LONE_MASTER_FIELD_NUMBER: _ClassVar[int]
    dropped_keys: _containers.RepeatedScalarFieldContainer[str]
    capability_keys: CapabilityKeys
    node_ttl_ms: int
    lone_master: bool
    def __init__(self, dropped_keys: _Optional[_Iterable[str]] = ..., capability_keys: _Optional[_Union[CapabilityKeys, _Mapping]] = ..., node_ttl_ms: _Optional[int] = ..., lone_master: _Optional[bool] = ...) -> None: ...

class UnmountSegmentRequest(_message.Message):
    __slots__ = ("node_id", "segment_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment_id: str
    def __init__(self, node_id: _Optional[str] = ..., segment_id: _Optional[str] = ...) -> None: ...

class UnmountSegmentResponse(_message.Message):
    __slots__ = ("objects_removed", "drain_ms")
    OBJECTS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    DRAIN_MS_FIELD_NUMBER: _ClassVar[int]
    objects_removed: int
    drain_ms: int
    def __init__(self, objects_removed: _Optional[int] = ..., drain_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "segment_ids", "incarnation", "draining", "unreadable")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment_ids: _containers.RepeatedScalarFieldContainer[str]
    incarnation: str
    draining: bool
    unreadable: _containers.RepeatedCompositeFieldContainer[UnreadableReplica]
    def __init__(self, node_id: _Optional[str] = ..., segment_ids: _Optional[_Iterable[str]] = ..., incarnation: _Optional[str] = ..., draining: _Optional[bool] = ..., unreadable: _Optional[_Iterable[_Union[UnreadableReplica, _Mapping]]] = ...) -> None: ...

class UnreadableReplica(_message.Message):
    __slots__ = ("segment_id", "key", "offset", "generation")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    key: str
    offset: int
    generation: int
    def __init__(self, segment_id: _Optional[str] = ..., key: _Optional[str] = ..., offset: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("remount_segment_ids", "draining", "drain_objects_left", "drain_bytes_left", "capability_keys", "master_time_ms", "node_ttl_ms", "lone_master")
    REMOUNT_SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    DRAIN_OBJECTS_LEFT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_BYTES_LEFT_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_KEYS_FIELD_NUMBER: _ClassVar[int]
    MASTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    LONE_MASTER_FIELD_NUMBER: _ClassVar[int]
    remount_segment_ids: _containers.RepeatedScalarFieldContainer[str]
    draining: bool
    drain_objects_left: int
    drain_bytes_left: int
    capability_keys: CapabilityKeys
    master_time_ms: int
    node_ttl_ms: int
    lone_master: bool
    def __init__(self, remount_segment_ids: _Optional[_Iterable[str]] = ..., draining: _Optional[bool] = ..., drain_objects_left: _Optional[int] = ..., drain_bytes_left: _Optional[int] = ..., capability_keys: _Optional[_Union[CapabilityKeys, _Mapping]] = ..., master_time_ms: _Optional[int] = ..., node_ttl_ms: _Optional[int] = ..., lone_master: _Optional[bool] = ...) -> None: ...

class PutStartRequest(_message.Message):
    __slots__ = ("client_id", "keys", "sizes", "replicas", "preferred_hosts", "pin", "pin_ttl_ms", "tier", "avoid_nodes", "mapped_segments")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_HOSTS_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    PIN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    AVOID_NODES_FIELD_NUMBER: _ClassVar[int]
    MAPPED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    replicas: int
    preferred_hosts: _containers.RepeatedScalarFieldContainer[str]
    pin: Pin
    pin_ttl_ms: int
    tier: Tier
    avoid_nodes: _containers.RepeatedScalarFieldContainer[str]
    mapped_segments: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., sizes: _Optional[_Iterable[int]] = ..., replicas: _Optional[int] = ..., preferred_hosts: _Optional[_Iterable[str]] = ..., pin: _Optional[_Union[Pin, str]] = ..., pin_ttl_ms: _Optional[int] = ..., tier: _Optional[_Union[Tier, str]] = ..., avoid_nodes: _Optional[_Iterable[str]] = ..., mapped_segments: _Optional[_Iterable[str]] = ...) -> None: ...

class PutSlot(_message.Message):
    __slots__ = ("status", "put_id", "replicas", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PUT_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: KeyStatus
    put_id: int
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    message: str
    def __init__(self, status: _Optional[_Union[KeyStatus, str]] = ..., put_id: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., message: _Optional[str] = ...) -> None: ...

class PutStartResponse(_message.Message):
    __slots__ = ("slots", "segments", "write_timeout_ms")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    WRITE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedCompositeFieldContainer[PutSlot]
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    write_timeout_ms: int
    def __init__(self, slots: _Optional[_Iterable[_Union[PutSlot, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., write_timeout_ms: _Optional[int] = ...) -> None: ...

class PutCommit(_message.Message):
    __slots__ = ("key", "put_id", "replica_ok", "crc32c")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PUT_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_OK_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    key: str
    put_id: int
    replica_ok: _containers.RepeatedScalarFieldContainer[bool]
    crc32c: int
    def __init__(self, key: _Optional[str] = ..., put_id: _Optional[int] = ..., replica_ok: _Optional[_Iterable[bool]] = ..., crc32c: _Optional[int] = ...) -> None: ...

class PutEndRequest(_message.Message):
    __slots__ = ("client_id", "commits")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    commits: _containers.RepeatedCompositeFieldContainer[PutCommit]
    def __init__(self, client_id: _Optional[str] = ..., commits: _Optional[_Iterable[_Union[PutCommit, _Mapping]]] = ...) -> None: ...

class PutEndResponse(_message.Message):
    __slots__ = ("statuses", "messages")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[KeyStatus]
    messages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, statuses: _Optional[_Iterable[_Union[KeyStatus, str]]] = ..., messages: _Optional[_Iterable[str]] = ...) -> None: ...

class PutRevokeRequest(_message.Message):
    __slots__ = ("client_id", "keys", "put_ids")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PUT_IDS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    put_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., put_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PutRevokeResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[KeyStatus]
    def __init__(self, statuses: _Optional[_Iterable[_Union[KeyStatus, str]]] = ...) -> None: ...

class GetReplicasRequest(_message.Message):
    __slots__ = ("client_id", "keys", "lease_ms", "mapped_segments")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    MAPPED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    lease_ms: int
    mapped_segments: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., lease_ms: _Optional[int] = ..., mapped_segments: _Optional[_Iterable[str]] = ...) -> None: ...

class ObjectLocation(_message.Message):
    __slots__ = ("status", "size", "replicas", "crc32c")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    status: KeyStatus
    size: int
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    crc32c: int
    def __init__(self, status: _Optional[_Union[KeyStatus, str]] = ..., size: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., crc32c: _Optional[int] = ...) -> None: ...

class GetReplicasResponse(_message.Message):
    __slots__ = ("objects", "segments", "lease_ms", "quota_refusal")
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REFUSAL_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[ObjectLocation]
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    lease_ms: int
    quota_refusal: str
    def __init__(self, objects: _Optional[_Iterable[_Union[ObjectLocation, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., lease_ms: _Optional[int] = ..., quota_refusal: _Optional[str] = ...) -> None: ...

class ExistsRequest(_message.Message):
    __slots__ = ("client_id", "keys", "lease_ms", "no_lease")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    NO_LEASE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    lease_ms: int
    no_lease: bool
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., lease_ms: _Optional[int] = ..., no_lease: _Optional[bool] = ...) -> None: ...

class ExistsResponse(_message.Message):
    __slots__ = ("statuses", "quota_refusal")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REFUSAL_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[KeyStatus]
    quota_refusal: str
    def __init__(self, statuses: _Optional[_Iterable[_Union[KeyStatus, str]]] = ..., quota_refusal: _Optional[str] = ...) -> None: ...

class ReleaseLeasesRequest(_message.Message):
    __slots__ = ("client_id", "keys")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseLeasesResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("client_id", "keys", "force")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    force: bool
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., force: _Optional[bool] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[KeyStatus]
    def __init__(self, statuses: _Optional[_Iterable[_Union[KeyStatus, str]]] = ...) -> None: ...

class RemovePrefixRequest(_message.Message):
    __slots__ = ("client_id", "prefix", "force", "start_after")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    prefix: str
    force: bool
    start_after: str
    def __init__(self, client_id: _Optional[str] = ..., prefix: _Optional[str] = ..., force: _Optional[bool] = ..., start_after: _Optional[str] = ...) -> None: ...

class RemovePrefixResponse(_message.Message):
    __slots__ = ("removed", "leased", "not_ready", "next_start_after")
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    NOT_READY_FIELD_NUMBER: _ClassVar[int]
    NEXT_START_AFTER_FIELD_NUMBER: _ClassVar[int]
    removed: int
    leased: int
    not_ready: int
    next_start_after: str
    def __init__(self, removed: _Optional[int] = ..., leased: _Optional[int] = ..., not_ready: _Optional[int] = ..., next_start_after: _Optional[str] = ...) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("segment_id", "node_id", "host", "tier", "address")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    node_id: str
    host: str
    tier: Tier
    address: int
    def __init__(self, segment_id: _Optional[str] = ..., node_id: _Optional[str] = ..., host: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., address: _Optional[int] = ...) -> None: ...

class StatResponse(_message.Message):
    __slots__ = ("status", "size", "state", "replicas", "lease_remaining_ms", "pin", "pin_remaining_ms", "crc32c", "age_ms", "idle_ms")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    PIN_REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    status: KeyStatus
    size: int
    state: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    lease_remaining_ms: int
    pin: Pin
    pin_remaining_ms: int
    crc32c: int
    age_ms: int
    idle_ms: int
    def __init__(self, status: _Optional[_Union[KeyStatus, str]] = ..., size: _Optional[int] = ..., state: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., lease_remaining_ms: _Optional[int] = ..., pin: _Optional[_Union[Pin, str]] = ..., pin_remaining_ms: _Optional[int] = ..., crc32c: _Optional[int] = ..., age_ms: _Optional[int] = ..., idle_ms: _Optional[int] = ...) -> None: ...

class StoryRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class StoryEvent(_message.Message):
    __slots__ = ("time", "age_s", "event", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TIME_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    time: float
    age_s: float
    event: str
    details: _containers.ScalarMap[str, str]
    def __init__(self, time: _Optional[float] = ..., age_s: _Optional[float] = ..., event: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class StoryResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[StoryEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[StoryEvent, _Mapping]]] = ...) -> None: ...

class NodeCommand(_message.Message):
    __slots__ = ("command_id", "persist", "forget", "copy", "prepare")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    PERSIST_FIELD_NUMBER: _ClassVar[int]
    FORGET_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    PREPARE_FIELD_NUMBER: _ClassVar[int]
    command_id: int
    persist: Persist
    forget: Forget
    copy: Copy
    prepare: Prepare
    def __init__(self, command_id: _Optional[int] = ..., persist: _Optional[_Union[Persist, _Mapping]] = ..., forget: _Optional[_Union[Forget, _Mapping]] = ..., copy: _Optional[_Union[Copy, _Mapping]] = ..., prepare: _Optional[_Union[Prepare, _Mapping]] = ...) -> None: ...

class Prepare(_message.Message):
    __slots__ = ("segment_id", "offset", "size")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    offset: int
    size: int
    def __init__(self, segment_id: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class Persist(_message.Message):
    __slots__ = ("segment_id", "objects")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    objects: _containers.RepeatedCompositeFieldContainer[StoredObject]
    def __init__(self, segment_id: _Optional[str] = ..., objects: _Optional[_Iterable[_Union[StoredObject, _Mapping]]] = ...) -> None: ...

class Forget(_message.Message):
    __slots__ = ("segment_id", "objects", "grants_end_ms", "term")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    GRANTS_END_MS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    objects: _containers.RepeatedCompositeFieldContainer[StoredObject]
    grants_end_ms: int
    term: int
    def __init__(self, segment_id: _Optional[str] = ..., objects: _Optional[_Iterable[_Union[StoredObject, _Mapping]]] = ..., grants_end_ms: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class Copy(_message.Message):
    __slots__ = ("source", "source_segment_id", "target", "target_segment_id", "source_segment", "capability")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    source: StoredObject
    source_segment_id: str
    target: StoredObject
    target_segment_id: str
    source_segment: Segment
    capability: bytes
    def __init__(self, source: _Optional[_Union[StoredObject, _Mapping]] = ..., source_segment_id: _Optional[str] = ..., target: _Optional[_Union[StoredObject, _Mapping]] = ..., target_segment_id: _Optional[str] = ..., source_segment: _Optional[_Union[Segment, _Mapping]] = ..., capability: _Optional[bytes] = ...) -> None: ...

class NodeReport(_message.Message):
    __slots__ = ("hello", "result")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    hello: NodeHello
    result: CommandResult
    def __init__(self, hello: _Optional[_Union[NodeHello, _Mapping]] = ..., result: _Optional[_Union[CommandResult, _Mapping]] = ...) -> None: ...

class NodeHello(_message.Message):
    __slots__ = ("node_id", "incarnation")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: str
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[str] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("command_id", "ok", "error", "crc32c", "source_corrupt")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    SOURCE_CORRUPT_FIELD_NUMBER: _ClassVar[int]
    command_id: int
    ok: bool
    error: str
    crc32c: _containers.RepeatedScalarFieldContainer[int]
    source_corrupt: bool
    def __init__(self, command_id: _Optional[int] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., crc32c: _Optional[_Iterable[int]] = ..., source_corrupt: _Optional[bool] = ...) -> None: ...

class ClientHeartbeatRequest(_message.Message):
    __slots__ = ("client_id",)
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    def __init__(self, client_id: _Optional[str] = ...) -> None: ...

class ClientHeartbeatResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LaneRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LaneResponse(_message.Message):
    __slots__ = ("port",)
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: int
    def __init__(self, port: _Optional[int] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ("prefix", "limit", "start_after")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    limit: int
    start_after: str
    def __init__(self, prefix: _Optional[str] = ..., limit: _Optional[int] = ..., start_after: _Optional[str] = ...) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("keys", "sizes", "next_start_after")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    NEXT_START_AFTER_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    next_start_after: str
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., sizes: _Optional[_Iterable[int]] = ..., next_start_after: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("objects_left", "bytes_left", "live_nodes")
    OBJECTS_LEFT_FIELD_NUMBER: _ClassVar[int]
    BYTES_LEFT_FIELD_NUMBER: _ClassVar[int]
    LIVE_NODES_FIELD_NUMBER: _ClassVar[int]
    objects_left: int
    bytes_left: int
    live_nodes: int
    def __init__(self, objects_left: _Optional[int] = ..., bytes_left: _Optional[int] = ..., live_nodes: _Optional[int] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SegmentStatus(_message.Message):
    __slots__ = ("segment_id", "node_id", "host", "tier", "capacity", "used", "objects", "largest_free", "persistent")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    LARGEST_FREE_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    node_id: str
    host: str
    tier: Tier
    capacity: int
    used: int
    objects: int
    largest_free: int
    persistent: bool
    def __init__(self, segment_id: _Optional[str] = ..., node_id: _Optional[str] = ..., host: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., objects: _Optional[int] = ..., largest_free: _Optional[int] = ..., persistent: _Optional[bool] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("segments", "objects", "reservations", "nodes", "uptime_s", "clients_refused")
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentStatus]
    objects: int
    reservations: int
    nodes: int
    uptime_s: float
    clients_refused: str
    def __init__(self, segments: _Optional[_Iterable[_Union[SegmentStatus, _Mapping]]] = ..., objects: _Optional[int] = ..., reservations: _Optional[int] = ..., nodes: _Optional[int] = ..., uptime_s: _Optional[float] = ..., clients_refused: _Optional[str] = ...) -> None: ...
