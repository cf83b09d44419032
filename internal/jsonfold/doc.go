// Package jsonfold is a speed trick: a hand-written JSON reader for the
// canonical form beam's log writes its event details in, used when the log
// rebuilds its projections (tracing's fold), where encoding/json's
// reflection made a rebuild about a fifth slower. It decodes only a strict
// subset (unescaped keys, plain integers, no null where a value is read)
// and answers ErrSlowPath for anything else, so the caller falls back to
// encoding/json, which decides. BEAM_TRICKS_OFF=details-fold (or all)
// turns it off (On).
//
// It is an internal helper, not a public API.
package jsonfold
