from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenSessionRequest(_message.Message):
    __slots__ = ("request_id", "ttl_ms", "open_key")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    OPEN_KEY_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    ttl_ms: int
    open_key: bytes
    def __init__(self, request_id: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., open_key: _Optional[bytes] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session", "ttl_ms", "session_secret")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    session: int
    ttl_ms: int
    session_secret: bytes
    def __init__(self, session: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., session_secret: _Optional[bytes] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("session", "session_secret")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    session: int
    session_secret: bytes
    def __init__(self, session: _Optional[int] = ..., session_secret: _Optional[bytes] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("session", "ttl_remaining_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TTL_REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    session: int
    ttl_remaining_ms: int
    def __init__(self, session: _Optional[int] = ..., ttl_remaining_ms: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session", "session_secret")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    session: int
    session_secret: bytes
    def __init__(self, session: _Optional[int] = ..., session_secret: _Optional[bytes] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("session", "lock", "request_id", "wait_ms", "wait_forever", "session_secret", "value", "shared", "permits")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOREVER_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    session: int
    lock: str
    request_id: int
    wait_ms: int
    wait_forever: bool
    session_secret: bytes
    value: str
    shared: bool
    permits: int
    def __init__(self, session: _Optional[int] = ..., lock: _Optional[str] = ..., request_id: _Optional[int] = ..., wait_ms: _Optional[int] = ..., wait_forever: _Optional[bool] = ..., session_secret: _Optional[bytes] = ..., value: _Optional[str] = ..., shared: _Optional[bool] = ..., permits: _Optional[int] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("lock", "session", "token", "sequencer", "access")
    LOCK_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SEQUENCER_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    lock: str
    session: int
    token: int
    sequencer: str
    access: Access
    def __init__(self, lock: _Optional[str] = ..., session: _Optional[int] = ..., token: _Optional[int] = ..., sequencer: _Optional[str] = ..., access: _Optional[_Union[Access, _Mapping]] = ...) -> None: ...

class AcquireAllRequest(_message.Message):
    __slots__ = ("session", "request_id", "wait_ms", "wait_forever", "session_secret", "parts")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOREVER_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    session: int
    request_id: int
    wait_ms: int
    wait_forever: bool
    session_secret: bytes
    parts: _containers.RepeatedCompositeFieldContainer[AcquirePart]
    def __init__(self, session: _Optional[int] = ..., request_id: _Optional[int] = ..., wait_ms: _Optional[int] = ..., wait_forever: _Optional[bool] = ..., session_secret: _Optional[bytes] = ..., parts: _Optional[_Iterable[_Union[AcquirePart, _Mapping]]] = ...) -> None: ...

class AcquirePart(_message.Message):
    __slots__ = ("lock", "shared", "permits")
    LOCK_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    lock: str
    shared: bool
    permits: int
    def __init__(self, lock: _Optional[str] = ..., shared: _Optional[bool] = ..., permits: _Optional[int] = ...) -> None: ...

class AcquireAllResponse(_message.Message):
    __slots__ = ("session", "grants")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    session: int
    grants: _containers.RepeatedCompositeFieldContainer[AcquireResponse]
    def __init__(self, session: _Optional[int] = ..., grants: _Optional[_Iterable[_Union[AcquireResponse, _Mapping]]] = ...) -> None: ...

class Access(_message.Message):
    __slots__ = ("shared", "slot")
    SHARED_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    shared: bool
    slot: int
    def __init__(self, shared: _Optional[bool] = ..., slot: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session", "lock", "request_id", "session_secret")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    session: int
    lock: str
    request_id: int
    session_secret: bytes
    def __init__(self, session: _Optional[int] = ..., lock: _Optional[str] = ..., request_id: _Optional[int] = ..., session_secret: _Optional[bytes] = ...) -> None: ...

class ReleaseThenAcquireRequest(_message.Message):
    __slots__ = ("acquire", "release", "release_request_id")
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    acquire: AcquireRequest
    release: str
    release_request_id: int
    def __init__(self, acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., release: _Optional[str] = ..., release_request_id: _Optional[int] = ...) -> None: ...

class ReleaseThenAcquireResponse(_message.Message):
    __slots__ = ("released_token", "grant")
    RELEASED_TOKEN_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    released_token: int
    grant: AcquireResponse
    def __init__(self, released_token: _Optional[int] = ..., grant: _Optional[_Union[AcquireResponse, _Mapping]] = ...) -> None: ...

class ProclaimRequest(_message.Message):
    __slots__ = ("session", "lock", "token", "value", "session_secret")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    session: int
    lock: str
    token: int
    value: str
    session_secret: bytes
    def __init__(self, session: _Optional[int] = ..., lock: _Optional[str] = ..., token: _Optional[int] = ..., value: _Optional[str] = ..., session_secret: _Optional[bytes] = ...) -> None: ...

class ProclaimResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: int
    def __init__(self, token: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("lock", "stale")
    LOCK_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    lock: str
    stale: bool
    def __init__(self, lock: _Optional[str] = ..., stale: _Optional[bool] = ...) -> None: ...

class LockInfo(_message.Message):
    __slots__ = ("lock", "holder", "last_token", "waiters", "lock_delay_remaining_ms", "sharers", "permits")
    LOCK_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    SHARERS_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    lock: str
    holder: Holder
    last_token: int
    waiters: _containers.RepeatedScalarFieldContainer[int]
    lock_delay_remaining_ms: int
    sharers: _containers.RepeatedCompositeFieldContainer[Holder]
    permits: int
    def __init__(self, lock: _Optional[str] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ..., last_token: _Optional[int] = ..., waiters: _Optional[_Iterable[int]] = ..., lock_delay_remaining_ms: _Optional[int] = ..., sharers: _Optional[_Iterable[_Union[Holder, _Mapping]]] = ..., permits: _Optional[int] = ...) -> None: ...

class Holder(_message.Message):
    __slots__ = ("session", "token", "lease_remaining_ms", "value", "access")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    session: int
    token: int
    lease_remaining_ms: int
    value: str
    access: Access
    def __init__(self, session: _Optional[int] = ..., token: _Optional[int] = ..., lease_remaining_ms: _Optional[int] = ..., value: _Optional[str] = ..., access: _Optional[_Union[Access, _Mapping]] = ...) -> None: ...

class ListLocksRequest(_message.Message):
    __slots__ = ("prefix", "start_after", "limit", "stale")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    start_after: str
    limit: int
    stale: bool
    def __init__(self, prefix: _Optional[str] = ..., start_after: _Optional[str] = ..., limit: _Optional[int] = ..., stale: _Optional[bool] = ...) -> None: ...

class ListLocksResponse(_message.Message):
    __slots__ = ("locks", "next_start_after")
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_START_AFTER_FIELD_NUMBER: _ClassVar[int]
    locks: _containers.RepeatedCompositeFieldContainer[LockInfo]
    next_start_after: str
    def __init__(self, locks: _Optional[_Iterable[_Union[LockInfo, _Mapping]]] = ..., next_start_after: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("lock",)
    LOCK_FIELD_NUMBER: _ClassVar[int]
    lock: str
    def __init__(self, lock: _Optional[str] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("kind", "lock", "session", "token", "waiters", "value", "access")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[WatchEvent.Kind]
        KIND_SNAPSHOT: _ClassVar[WatchEvent.Kind]
        KIND_GRANTED: _ClassVar[WatchEvent.Kind]
        KIND_RELEASED: _ClassVar[WatchEvent.Kind]
        KIND_EXPIRED: _ClassVar[WatchEvent.Kind]
        KIND_VALUE_SET: _ClassVar[WatchEvent.Kind]
    KIND_UNSPECIFIED: WatchEvent.Kind
    KIND_SNAPSHOT: WatchEvent.Kind
    KIND_GRANTED: WatchEvent.Kind
    KIND_RELEASED: WatchEvent.Kind
    KIND_EXPIRED: WatchEvent.Kind
    KIND_VALUE_SET: WatchEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    kind: WatchEvent.Kind
    lock: str
    session: int
    token: int
    waiters: int
    value: str
    access: Access
    def __init__(self, kind: _Optional[_Union[WatchEvent.Kind, str]] = ..., lock: _Optional[str] = ..., session: _Optional[int] = ..., token: _Optional[int] = ..., waiters: _Optional[int] = ..., value: _Optional[str] = ..., access: _Optional[_Union[Access, _Mapping]] = ...) -> None: ...

class PublicKeyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PublicKeyResponse(_message.Message):
    __slots__ = ("public_key", "public_keys")
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEYS_FIELD_NUMBER: _ClassVar[int]
    public_key: str
    public_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, public_key: _Optional[str] = ..., public_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("kind", "category", "lock", "session", "holder_session", "holder_token", "available_at_ms", "request_id", "reason", "ttl_ms", "ttl_ms_min", "ttl_ms_max", "wait_ms", "wait_ms_max", "bytes", "bytes_min", "bytes_max", "sessions_max", "locks_max", "waiters_max", "limits_problem", "identity", "right", "scope", "quota", "quota_max", "permits", "permits_max", "requested_permits", "held_shared", "locks")
    KIND_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    HOLDER_SESSION_FIELD_NUMBER: _ClassVar[int]
    HOLDER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_MIN_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_MAX_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_MAX_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_MIN_FIELD_NUMBER: _ClassVar[int]
    BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_MAX_FIELD_NUMBER: _ClassVar[int]
    LOCKS_MAX_FIELD_NUMBER: _ClassVar[int]
    WAITERS_MAX_FIELD_NUMBER: _ClassVar[int]
    LIMITS_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    QUOTA_MAX_FIELD_NUMBER: _ClassVar[int]
    PERMITS_FIELD_NUMBER: _ClassVar[int]
    PERMITS_MAX_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_PERMITS_FIELD_NUMBER: _ClassVar[int]
    HELD_SHARED_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    category: str
    lock: str
    session: int
    holder_session: int
    holder_token: int
    available_at_ms: int
    request_id: int
    reason: str
    ttl_ms: int
    ttl_ms_min: int
    ttl_ms_max: int
    wait_ms: int
    wait_ms_max: int
    bytes: int
    bytes_min: int
    bytes_max: int
    sessions_max: int
    locks_max: int
    waiters_max: int
    limits_problem: str
    identity: str
    right: str
    scope: str
    quota: str
    quota_max: int
    permits: int
    permits_max: int
    requested_permits: int
    held_shared: bool
    locks: int
    def __init__(self, kind: _Optional[str] = ..., category: _Optional[str] = ..., lock: _Optional[str] = ..., session: _Optional[int] = ..., holder_session: _Optional[int] = ..., holder_token: _Optional[int] = ..., available_at_ms: _Optional[int] = ..., request_id: _Optional[int] = ..., reason: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., ttl_ms_min: _Optional[int] = ..., ttl_ms_max: _Optional[int] = ..., wait_ms: _Optional[int] = ..., wait_ms_max: _Optional[int] = ..., bytes: _Optional[int] = ..., bytes_min: _Optional[int] = ..., bytes_max: _Optional[int] = ..., sessions_max: _Optional[int] = ..., locks_max: _Optional[int] = ..., waiters_max: _Optional[int] = ..., limits_problem: _Optional[str] = ..., identity: _Optional[str] = ..., right: _Optional[str] = ..., scope: _Optional[str] = ..., quota: _Optional[str] = ..., quota_max: _Optional[int] = ..., permits: _Optional[int] = ..., permits_max: _Optional[int] = ..., requested_permits: _Optional[int] = ..., held_shared: _Optional[bool] = ..., locks: _Optional[int] = ...) -> None: ...

class RaiseTokenFloorRequest(_message.Message):
    __slots__ = ("floor", "force")
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    floor: int
    force: bool
    def __init__(self, floor: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class RaiseTokenFloorResponse(_message.Message):
    __slots__ = ("last_token",)
    LAST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    last_token: int
    def __init__(self, last_token: _Optional[int] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BackupChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AddKeyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RotateKeyRequest(_message.Message):
    __slots__ = ("key_id",)
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    def __init__(self, key_id: _Optional[str] = ...) -> None: ...

class RetireKeyRequest(_message.Message):
    __slots__ = ("key_id",)
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    def __init__(self, key_id: _Optional[str] = ...) -> None: ...

class PublishedKey(_message.Message):
    __slots__ = ("key_id", "public_key", "signing")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNING_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    public_key: str
    signing: bool
    def __init__(self, key_id: _Optional[str] = ..., public_key: _Optional[str] = ..., signing: _Optional[bool] = ...) -> None: ...

class KeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[PublishedKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[PublishedKey, _Mapping]]] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterMember(_message.Message):
    __slots__ = ("id", "address", "kind", "matched_index")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MATCHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    id: int
    address: str
    kind: str
    matched_index: int
    def __init__(self, id: _Optional[int] = ..., address: _Optional[str] = ..., kind: _Optional[str] = ..., matched_index: _Optional[int] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("node_id", "role", "term", "leader", "applied_index", "committed_index", "last_log_index", "members")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    role: str
    term: int
    leader: int
    applied_index: int
    committed_index: int
    last_log_index: int
    members: _containers.RepeatedCompositeFieldContainer[ClusterMember]
    def __init__(self, node_id: _Optional[int] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader: _Optional[int] = ..., applied_index: _Optional[int] = ..., committed_index: _Optional[int] = ..., last_log_index: _Optional[int] = ..., members: _Optional[_Iterable[_Union[ClusterMember, _Mapping]]] = ...) -> None: ...

class AddMemberRequest(_message.Message):
    __slots__ = ("id", "address")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: int
    address: str
    def __init__(self, id: _Optional[int] = ..., address: _Optional[str] = ...) -> None: ...

class RemoveMemberRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class MembershipResponse(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[ClusterMember]
    def __init__(self, members: _Optional[_Iterable[_Union[ClusterMember, _Mapping]]] = ...) -> None: ...
