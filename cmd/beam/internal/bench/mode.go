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
	// modeBus sends durable bus messages and acks them.
	modeBus Mode = "bus"
	// ModeFederation sends across two federated directories.
	ModeFederation Mode = "federation"
)

// modes lists every mode name beam bench accepts, available or not.
var modes = []Mode{ModeWS, ModeHTTP, modeBus, ModeFederation, modeMesh, ModeA2A}

// ErrModeUnavailable is wrapped by Run for a mode that is accepted but not
// implemented yet.
var ErrModeUnavailable = errors.New("mode is not available yet")

// env is what a Driver works with: the directory, the registered agents
// (recipients already connected and answering) and a shared HTTP client.
type env struct {
	// URL is the directory's base URL.
	URL string
	// Fleet holds the agents of the run.
	Fleet *fleet
	// HTTP is the client to use for requests and WebSocket dials.
	HTTP *http.Client
	// Config is the run's configuration.
	Config Config
	// Clock is the time source for frame timestamps.
	Clock func() time.Time
}

// driver sends intents in one mode.
type driver interface {
	// Send sends one signed intent from one agent to another and returns
	// once its result is back: nil when the recipient answered with a
	// verified success, else an error (codeOf names its failure code).
	Send(ctx context.Context, from, to *agent) error
	// Close releases the driver's connections.
	Close() error
}

// driverFactory builds a mode's driver once the fleet is registered and
// its recipients connected.
type driverFactory func(ctx context.Context, env *env) (driver, error)

var (
	modesMu sync.RWMutex
	drivers = map[Mode]driverFactory{}
)

// registerMode makes mode available with factory, replacing an earlier
// registration. The bus and federation modes register themselves here.
func registerMode(mode Mode, factory driverFactory) {
	modesMu.Lock()
	defer modesMu.Unlock()
	drivers[mode] = factory
}

// factoryFor returns the driver factory of mode.
func factoryFor(mode Mode) (driverFactory, error) {
	modesMu.RLock()
	defer modesMu.RUnlock()
	if f, ok := drivers[mode]; ok {
		return f, nil
	}
	if slices.Contains(modes, mode) {
		return nil, fmt.Errorf("mode %s: %w", mode, ErrModeUnavailable)
	}
	return nil, fmt.Errorf("unknown mode %q: want one of %v", mode, modes)
}

func init() {
	registerMode(ModeWS, newWSDriver)
	registerMode(ModeHTTP, newHTTPDriver)
	registerMode(modeBus, newBusDriver)
	registerMode(modeMesh, newMeshDriver)
	registerMode(ModeA2A, newA2ADriver)
	// Federation sends over the senders' sessions on the first directory
	// to recipients connected to the second; Run places the agents.
	registerMode(ModeFederation, newWSDriver)
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

// codeOf returns the failure code of an error a Driver returned: the
// directory's or recipient's errorCode, TIMEOUT for an expired context, or
// CLIENT_ERROR for anything else.
func codeOf(err error) string {
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
