package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/beamdir/beam/agents"
)

// Mode names a way of sending intents. The names are a stable interface of
// `beam bench --mode`.
type Mode string

// The modes of beam bench.
const (
	// ModeWS sends intents over the senders' WebSocket sessions.
	ModeWS Mode = "ws"
	// ModeHTTP sends intents with POST /intents/send.
	ModeHTTP Mode = "http"
	// ModeBus sends durable bus messages and acks them.
	ModeBus Mode = "bus"
	// ModeFederation sends across two federated directories.
	ModeFederation Mode = "federation"
)

// Modes lists every mode name beam bench accepts, available or not.
var Modes = []Mode{ModeWS, ModeHTTP, ModeBus, ModeFederation, ModeMesh, ModeA2A}

// ErrModeUnavailable is wrapped by Run for a mode that is accepted but not
// implemented yet.
var ErrModeUnavailable = errors.New("mode is not available yet")

// Env is what a Driver works with: the directory, the registered agents
// (recipients already connected and answering) and a shared HTTP client.
type Env struct {
	// URL is the directory's base URL.
	URL string
	// Fleet holds the agents of the run.
	Fleet *Fleet
	// HTTP is the client to use for requests and WebSocket dials.
	HTTP *http.Client
	// Config is the run's configuration.
	Config Config
	// Clock is the time source for frame timestamps.
	Clock func() time.Time
}

// Driver sends intents in one mode.
type Driver interface {
	// Send sends one signed intent from one agent to another and returns
	// once its result is back: nil when the recipient answered with a
	// verified success, else an error (CodeOf names its failure code).
	Send(ctx context.Context, from, to *Agent) error
	// Close releases the driver's connections.
	Close() error
}

// DriverFactory builds a mode's driver once the fleet is registered and
// its recipients connected.
type DriverFactory func(ctx context.Context, env *Env) (Driver, error)

var (
	modesMu sync.RWMutex
	drivers = map[Mode]DriverFactory{}
)

// RegisterMode makes mode available with factory, replacing an earlier
// registration. The bus and federation modes register themselves here.
func RegisterMode(mode Mode, factory DriverFactory) {
	modesMu.Lock()
	defer modesMu.Unlock()
	drivers[mode] = factory
}

// factoryFor returns the driver factory of mode.
func factoryFor(mode Mode) (DriverFactory, error) {
	modesMu.RLock()
	defer modesMu.RUnlock()
	if f, ok := drivers[mode]; ok {
		return f, nil
	}
	if slices.Contains(Modes, mode) {
		return nil, fmt.Errorf("mode %s: %w", mode, ErrModeUnavailable)
	}
	return nil, fmt.Errorf("unknown mode %q: want one of %v", mode, Modes)
}

func init() {
	RegisterMode(ModeWS, newWSDriver)
	RegisterMode(ModeHTTP, newHTTPDriver)
	RegisterMode(ModeBus, newBusDriver)
	RegisterMode(ModeMesh, newMeshDriver)
	RegisterMode(ModeA2A, newA2ADriver)
	// Federation sends over the senders' sessions on the first directory
	// to recipients connected to the second; Run places the agents.
	RegisterMode(ModeFederation, newWSDriver)
}

// codeError is a failed intent with its failure code.
type codeError struct {
	code string
	msg  string
}

func (e *codeError) Error() string { return e.code + ": " + e.msg }

// failure returns an error carrying code.
func failure(code, format string, args ...any) error {
	return &codeError{code: code, msg: fmt.Sprintf(format, args...)}
}

// CodeOf returns the failure code of an error a Driver returned: the
// directory's or recipient's errorCode, TIMEOUT for an expired context, or
// CLIENT_ERROR for anything else.
func CodeOf(err error) string {
	var ce *codeError
	if errors.As(err, &ce) {
		return ce.code
	}
	var ae *agents.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "TIMEOUT"
	}
	return "CLIENT_ERROR"
}

// CheckMode reports whether mode can run: nil, an error wrapping
// ErrModeUnavailable for a known mode without a driver yet, or an error for
// an unknown name.
func CheckMode(mode Mode) error {
	_, err := factoryFor(mode)
	return err
}
