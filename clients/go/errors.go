package palisade

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"

	"example.invalid/palisade/clients/go/palisadev1"
)

// The classes of failure, one per way a caller reacts (the Rust client's ErrorClass). Every
// *Error matches exactly one with errors.Is.
var (
	// ErrRefused: the service refused the request as made; sending it again unchanged fails
	// again. Nothing changed.
	ErrRefused = errors.New("refused")
	// ErrNotAcquired: the lock was not acquired (busy, the wait ended, a limit); trying again
	// later may succeed. Nothing changed.
	ErrNotAcquired = errors.New("not acquired")
	// ErrUnavailable: the request was not applied (no member reachable, an election, a
	// shutdown, a limit on keepalive streams); retry later.
	ErrUnavailable = errors.New("unavailable")
	// ErrOutcomeUnknown: the request may or may not have taken effect (a timeout, a connection
	// that broke after it was sent).
	ErrOutcomeUnknown = errors.New("outcome unknown")
	// ErrProtocol: the service broke the protocol or failed internally.
	ErrProtocol = errors.New("protocol error")
	// ErrMisconfigured: the client is configured wrongly.
	ErrMisconfigured = errors.New("misconfigured")
)

// The lock table's refusals, by ErrorDetail.kind (a kind this client does not know is classified
// by its status code). Each also matches its class: errors.Is(err, ErrBusy) and
// errors.Is(err, ErrNotAcquired) both hold for a busy lock.
var (
	ErrBusy             = errors.New("busy")
	ErrWaitEnded        = errors.New("wait ended")
	ErrLimitReached     = errors.New("limit reached")
	ErrSessionNotFound  = errors.New("session not found")
	ErrNotHolder        = errors.New("not holder")
	ErrUnauthenticated  = errors.New("unauthenticated")
	ErrPermissionDenied = errors.New("permission denied")
	ErrSessionNotOwned  = errors.New("session not owned")
	ErrQuotaReached     = errors.New("quota reached")
	ErrInvalidArgument  = errors.New("invalid argument")
	ErrTokensExhausted  = errors.New("tokens exhausted")
	// ErrUnreachable: no endpoint accepted a connection (class ErrUnavailable).
	ErrUnreachable = errors.New("unreachable")
	// ErrInvalidEndpoint: an endpoint is not host:port, or the list is empty or too long (class
	// ErrMisconfigured).
	ErrInvalidEndpoint = errors.New("invalid endpoint")
	// ErrSessionLost: the session ended while in use; every lock it held must be assumed lost.
	// The error is a *SessionLostError.
	ErrSessionLost = errors.New("session lost")
)

// Error is every failure of a call to the service. errors.Is matches its class and, for a
// refusal of the lock table, its kind; Detail is the service's ErrorDetail when there is one.
type Error struct {
	// Class is one of ErrRefused, ErrNotAcquired, ErrUnavailable, ErrOutcomeUnknown,
	// ErrProtocol, ErrMisconfigured.
	Class error
	// Kind is the sentinel of the refusal (ErrBusy, ...), or nil.
	Kind error
	// Code is the gRPC status code, when the error came from a status (codes.OK otherwise).
	Code codes.Code
	// Detail is the service's palisadev1.ErrorDetail when the lock table refused the request.
	Detail *palisadev1.ErrorDetail
	// Message says what failed and why, for people: never parse it.
	Message string
	// cause is a context's error when the caller's context ended the call.
	cause error
}

func (e *Error) Error() string { return e.Message }

// Is matches the class and the kind.
func (e *Error) Is(target error) bool {
	return target == e.Class || (e.Kind != nil && target == e.Kind)
}

// Unwrap is the context's error when the caller's context ended the call, so that
// errors.Is(err, context.DeadlineExceeded) holds.
func (e *Error) Unwrap() error { return e.cause }

// ErrorKind is ErrorDetail.kind, the stable snake_case name of a refusal, or "" without one.
func (e *Error) ErrorKind() string {
	if e.Detail == nil {
		return ""
	}
	return e.Detail.GetKind()
}

// Retryable reports whether the same call may succeed later without the caller changing
// anything.
func (e *Error) Retryable() bool {
	return e.Class == ErrNotAcquired || e.Class == ErrUnavailable || e.Class == ErrOutcomeUnknown
}

// The reasons a session ends (SessionLostError.Reason).
const (
	// LostNotFound: the service no longer knows the session (it expired or was closed).
	LostNotFound = "not_found"
	// LostLeaseUnproven: no renewal was acknowledged within the lease, so the service may have
	// expired it. The library keeps renewing it, best effort, until its owner closes it.
	LostLeaseUnproven = "lease_unproven"
	// LostClosed: this process closed it.
	LostClosed = "closed"
)

// SessionLostError says why a session ended; errors.Is(err, ErrSessionLost) holds.
type SessionLostError struct {
	Session uint64
	Reason  string
}

func (e *SessionLostError) Error() string {
	return fmt.Sprintf("session %d lost: %s", e.Session, DescribeLost(e.Reason))
}

// Is matches ErrSessionLost.
func (e *SessionLostError) Is(target error) bool { return target == ErrSessionLost }

// DescribeLost says a loss reason in words.
func DescribeLost(reason string) string {
	switch reason {
	case LostNotFound:
		return "the lock service no longer knows the session (it expired or was closed)"
	case LostLeaseUnproven:
		return "no keepalive was acknowledged within the session's ttl, so its lease may have run out"
	case LostClosed:
		return "the session was closed"
	}
	return reason
}

var kinds = map[string]struct{ class, kind error }{
	"session_not_found":      {ErrRefused, ErrSessionNotFound},
	"ttl_out_of_range":       {ErrRefused, ErrInvalidArgument},
	"wait_out_of_range":      {ErrRefused, ErrInvalidArgument},
	"invalid_lock_name":      {ErrRefused, ErrInvalidArgument},
	"invalid_open_key":       {ErrRefused, ErrInvalidArgument},
	"invalid_value":          {ErrRefused, ErrInvalidArgument},
	"request_id_conflict":    {ErrRefused, ErrInvalidArgument},
	"too_many_sessions":      {ErrNotAcquired, ErrLimitReached},
	"too_many_locks":         {ErrNotAcquired, ErrLimitReached},
	"too_many_waiters":       {ErrNotAcquired, ErrLimitReached},
	"busy":                   {ErrNotAcquired, ErrBusy},
	"not_holder":             {ErrRefused, ErrNotHolder},
	"wait_ended":             {ErrNotAcquired, ErrWaitEnded},
	"tokens_exhausted":       {ErrRefused, ErrTokensExhausted},
	"invalid_limits":         {ErrProtocol, nil},
	"session_secret_missing": {ErrRefused, ErrUnauthenticated},
	"session_secret_wrong":   {ErrRefused, ErrUnauthenticated},
	"unauthenticated":        {ErrRefused, ErrUnauthenticated},
	"permission_denied":      {ErrRefused, ErrPermissionDenied},
	"session_not_owned":      {ErrRefused, ErrSessionNotOwned},
	"quota_reached":          {ErrRefused, ErrQuotaReached},
	"permits_out_of_range":   {ErrRefused, ErrInvalidArgument},
	"permits_mismatch":       {ErrRefused, ErrInvalidArgument},
	"mode_conflict":          {ErrRefused, ErrInvalidArgument},
	"multi_lock_size":        {ErrRefused, ErrInvalidArgument},
	"multi_lock_repeated":    {ErrRefused, ErrInvalidArgument},
	"multi_lock_held":        {ErrRefused, ErrInvalidArgument},
}

// ofCode is the class and kind of a status this client names no other way (ErrorClass::of_code).
func ofCode(code codes.Code) (class, kind error) {
	switch code {
	case codes.Internal, codes.DataLoss, codes.Unimplemented:
		return ErrProtocol, nil
	case codes.Unavailable, codes.ResourceExhausted:
		return ErrUnavailable, nil
	case codes.Unknown, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return ErrOutcomeUnknown, nil
	case codes.NotFound:
		return ErrRefused, ErrSessionNotFound
	case codes.InvalidArgument:
		return ErrRefused, ErrInvalidArgument
	case codes.Unauthenticated:
		return ErrRefused, ErrUnauthenticated
	case codes.PermissionDenied:
		return ErrRefused, ErrNotHolder
	}
	return ErrRefused, nil
}

func invalidArgument(format string, args ...any) *Error {
	return &Error{Class: ErrRefused, Kind: ErrInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

func misconfigured(kind error, format string, args ...any) *Error {
	return &Error{Class: ErrMisconfigured, Kind: kind, Message: fmt.Sprintf(format, args...)}
}

func protocolError(format string, args ...any) *Error {
	return &Error{Class: ErrProtocol, Message: fmt.Sprintf(format, args...)}
}
