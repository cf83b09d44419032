package main

import (
	"flag"
	"time"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/internal/limits"
)

// limitFlags are beam serve's resource-limit flags (docs/SECURITY.md,
// "Limits").
type limitFlags struct {
	off                                   bool
	registerRate, connect, intents, sends rateFlag
	meshCreates                           rateFlag
	meshOpen                              int
	maxConns, maxConnsPerAddr             int
	readTimeout, writeTimeout, idleTmo    time.Duration
	intentMaxConns, intentMaxConnsPerAddr int
	intentIdleTmo                         time.Duration
}

// rateFlag is a beam.Rate flag in limits.ParseRate's N/DURATION form.
type rateFlag struct{ r *beam.Rate }

func (f rateFlag) String() string {
	if f.r == nil {
		return ""
	}
	return f.r.String()
}

func (f rateFlag) Set(s string) error {
	r, err := limits.ParseRate(s)
	if err != nil {
		return err
	}
	*f.r = beam.Rate(r)
	return nil
}

func (f *limitFlags) register(fs *flag.FlagSet) {
	d := beam.DefaultLimits() // the rate flags write into it
	f.registerRate, f.connect, f.intents, f.sends = rateFlag{&d.Register}, rateFlag{&d.Connect}, rateFlag{&d.Intents}, rateFlag{&d.BusSends}
	fs.BoolVar(&f.off, "no-rate-limits", false, "turn every rate limit off (load tests; beam bench sets it on the server it starts)")
	fs.Var(f.registerRate, "limit-register", "registrations per client address, N/DURATION (bursts up to N; off disables)")
	fs.Var(f.connect, "limit-connect", "WebSocket connects per client address, N/DURATION")
	fs.Var(f.intents, "limit-intents", "intents per sending agent, N/DURATION")
	fs.Var(f.sends, "limit-bus-sends", "message bus sends (POST /v1/beam/send) per sending agent, N/DURATION")
	f.meshCreates = rateFlag{&d.MeshCreates}
	fs.Var(f.meshCreates, "limit-mesh-creates", "pipeline envelopes (POST /api/v1/mesh) per creating agent, N/DURATION")
	fs.IntVar(&f.meshOpen, "limit-mesh-open", d.MeshOpenPerCreator, "most open pipeline envelopes of one creating agent (0: no cap)")
	fs.IntVar(&f.maxConns, "max-conns", d.MaxConns, "most open HTTP connections (0: no cap)")
	fs.IntVar(&f.maxConnsPerAddr, "max-conns-per-addr", d.MaxConnsPerAddr, "most open HTTP connections from one client address (0: no cap)")
	fs.DurationVar(&f.readTimeout, "read-timeout", d.ReadTimeout, "how long a client may take to send a request body")
	fs.DurationVar(&f.writeTimeout, "write-timeout", d.WriteTimeout, "how long one response may take (0: the longest result timeout plus 30s; streams are exempt)")
	fs.DurationVar(&f.idleTmo, "idle-timeout", d.IdleTimeout, "how long an idle keep-alive connection stays open")
	fs.IntVar(&f.intentMaxConns, "intent-max-conns", d.JobBusMaxConns, "most open connections to the Intent Protocol listener (0: no cap)")
	fs.IntVar(&f.intentMaxConnsPerAddr, "intent-max-conns-per-addr", d.JobBusMaxConnsPerAddr, "most open Intent Protocol connections from one client address (0: no cap)")
	fs.DurationVar(&f.intentIdleTmo, "intent-idle-timeout", d.JobBusIdleTimeout, "how long an Intent Protocol connection may wait for its next request (a new one: for its headers, at most 10s)")
}

// config returns the directory's limits as the flags set them.
func (f *limitFlags) config() beam.Limits {
	l := beam.Limits{
		Register: *f.registerRate.r, Connect: *f.connect.r, Intents: *f.intents.r, BusSends: *f.sends.r,
		MeshCreates: *f.meshCreates.r, MeshOpenPerCreator: f.meshOpen,
		MaxConns: f.maxConns, MaxConnsPerAddr: f.maxConnsPerAddr,
		ReadTimeout: f.readTimeout, WriteTimeout: f.writeTimeout, IdleTimeout: f.idleTmo,
		JobBusMaxConns: f.intentMaxConns, JobBusMaxConnsPerAddr: f.intentMaxConnsPerAddr, JobBusIdleTimeout: f.intentIdleTmo,
	}
	if f.off {
		l.Register, l.Connect, l.Intents, l.BusSends = beam.Rate{}, beam.Rate{}, beam.Rate{}, beam.Rate{}
		l.MeshCreates, l.MeshOpenPerCreator = beam.Rate{}, 0
	}
	return l
}
