package main

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/federation/cluster"
)

// runPeer dispatches `beam peer show-self|add|list|remove`.
func runPeer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintln(stderr, "usage: beam peer <show-self|nats-user|add|list|remove|outbox|replay> [flags]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "  show-self --data-dir DIR --domain D --nats-listen HOST:PORT   print this directory's peer line")
		fmt.Fprintln(stderr, "  nats-user --data-dir DIR --domain D   print this directory's user entry for a shared NATS deployment (--nats-url)")
		fmt.Fprintln(stderr, "  add LINE      pin a peer in a running directory")
		fmt.Fprintln(stderr, "  list          list the pinned peers of a running directory")
		fmt.Fprintln(stderr, "  remove DOMAIN unpin a peer")
		fmt.Fprintln(stderr, "  outbox        list outbox rows (--state DEAD by default)")
		fmt.Fprintln(stderr, "  replay ID     publish a DEAD (or PUBLISHED) outbox row again")
	}
	if len(args) == 0 {
		usage()
		return errUsage
	}
	switch args[0] {
	case "show-self":
		return runPeerShowSelf(args[1:], stdout, stderr)
	case "nats-user":
		return runPeerNATSUser(args[1:], stdout, stderr)
	case "add", "list", "remove":
		return runPeerRemote(ctx, args[0], args[1:], stdout, stderr)
	case "outbox", "replay":
		return runPeerOutbox(ctx, args[0], args[1:], stdout, stderr)
	case "-h", "--help", "help":
		usage()
		return nil
	default:
		fmt.Fprintf(stderr, "beam peer: unknown subcommand %q\n", args[0])
		usage()
		return errUsage
	}
}

// runPeerShowSelf prints DOMAIN=nats://HOST:PORT#PUBLICKEY, creating the
// directory key when the data directory has none. The output is a stable,
// scriptable interface: one line, nothing else on stdout.
func runPeerShowSelf(args []string, stdout, stderr io.Writer) error {
	fs := newPlainCmdFlags("beam peer show-self", stderr, "beam peer show-self --data-dir DIR --domain D --nats-listen HOST:PORT")
	var dataDir, domain, natsListen string
	fs.StringVar(&dataDir, "data-dir", "./beam-data", "data directory holding the directory key")
	fs.StringVar(&domain, "domain", "", "this directory's domain, e.g. acme.beam.directory (required)")
	fs.StringVar(&natsListen, "nats-listen", "", "HOST:PORT where peers reach this directory's NATS server (required)")
	if err := fs.parse(args, 0, 0); err != nil {
		return err
	}
	if domain == "" {
		return fs.missing("domain")
	}
	if natsListen == "" {
		return fs.missing("nats-listen")
	}
	if err := federation.ValidDomain(domain); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(natsListen); err != nil {
		return fmt.Errorf("--nats-listen %q: %w", natsListen, err)
	}
	priv, _, err := federation.LoadOrCreateKey(dataDir)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, federation.SelfLine(domain, natsListen, priv.Public().(ed25519.PublicKey)))
	return nil
}

// runPeerNATSUser prints the nats-server configuration entry of this
// directory's nkey user with the permissions a shared deployment grants it
// (federation.SharedPermissions, or with --cluster those of a cluster's
// nodes, cluster.NodePermissions), creating the key when the data
// directory has none.
func runPeerNATSUser(args []string, stdout, stderr io.Writer) error {
	fs := newPlainCmdFlags("beam peer nats-user", stderr, "beam peer nats-user --data-dir DIR --domain D [--cluster]")
	var dataDir, domain string
	var nodes bool
	fs.StringVar(&dataDir, "data-dir", "./beam-data", "data directory holding the directory key")
	fs.StringVar(&domain, "domain", "", "this directory's domain, e.g. acme.beam.directory (required)")
	fs.BoolVar(&nodes, "cluster", false, "the user of a cluster's nodes (beam serve --cluster --nats-url): also JetStream and the cluster's subjects")
	if err := fs.parse(args, 0, 0); err != nil {
		return err
	}
	if domain == "" {
		return fs.missing("domain")
	}
	if err := federation.ValidDomain(domain); err != nil {
		return err
	}
	priv, _, err := federation.LoadOrCreateKey(dataDir)
	if err != nil {
		return err
	}
	perms := federation.SharedPermissions(domain)
	if nodes {
		perms = cluster.NodePermissions(domain)
	}
	entry, err := federation.UserConfig(domain, priv.Public().(ed25519.PublicKey), perms)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, entry)
	return nil
}

func runPeerRemote(ctx context.Context, sub string, args []string, stdout, stderr io.Writer) error {
	synopsis := map[string]string{
		"add":    "beam peer add [--url URL] [--admin-token T] DOMAIN=nats://HOST:PORT#PUBLICKEY",
		"list":   "beam peer list [--url URL] [--admin-token T] [--json]",
		"remove": "beam peer remove [--url URL] [--admin-token T] DOMAIN",
	}[sub]
	fs := newPlainCmdFlags("beam peer "+sub, stderr, synopsis)
	of := newOperatorFlags(fs.FlagSet)
	var asJSON bool
	if sub == "list" {
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	}
	want := map[string]int{"add": 1, "list": 0, "remove": 1}[sub]
	if err := fs.parse(args, want, want); err != nil {
		return err
	}
	var method, path string
	var body any
	switch sub {
	case "add":
		if _, err := federation.ParsePeerLine(fs.Arg(0)); err != nil {
			return err
		}
		method, path = http.MethodPost, "/federation/peers"
		body = map[string]string{"line": fs.Arg(0)}
	case "remove":
		method, path = http.MethodDelete, "/federation/peers/"+url.PathEscape(fs.Arg(0))
	default:
		method, path = http.MethodGet, "/federation/peers"
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	data, status, err := of.call(ctx, method, path, nil, body)
	if status == http.StatusNotFound {
		if !json.Valid(data) {
			// The mux's own (plain text) 404: the federation routes are
			// not mounted.
			return fmt.Errorf("federation is off on the directory at %s: start beam serve with --domain DOMAIN and --nats-listen HOST:PORT (or --nats-url URL) to turn it on", of.url)
		}
	}
	if err != nil {
		return err
	}
	switch sub {
	case "add":
		fmt.Fprintf(stdout, "pinned %s\n", strings.SplitN(fs.Arg(0), "=", 2)[0])
	case "remove":
		fmt.Fprintf(stdout, "removed %s\n", fs.Arg(0))
	default:
		if asJSON {
			_, err := stdout.Write(data)
			return err
		}
		var out struct {
			Peers []federation.PeerView `json:"peers"`
		}
		if err := json.Unmarshal(data, &out); err != nil {
			return errors.New("unexpected response from the directory")
		}
		links := peerLinks(ctx, of)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DOMAIN\tURL\tLINK\tLAST CONTACT\tKEY")
		var down []federation.PeerView
		for _, p := range out.Peers {
			last := "never"
			if !p.LastContact.IsZero() {
				last = p.LastContact.UTC().Format(time.RFC3339)
			}
			link := "unknown"
			if l, ok := links[p.Domain]; ok {
				link = linkText(l)
				if l.Connected != nil && !*l.Connected {
					down = append(down, p)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Domain, p.URL, link, last, p.PublicKey)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, p := range down {
			fmt.Fprintf(stdout, "%s is unreachable: no connection to %s. Check that its directory is running and that this host reaches that address; "+
				"plain sends to its agents fail at once (DELIVERY_FAILED) once a lost link has been down 2 s, durable ones wait in the outbox until it is back.\n", p.Domain, p.URL)
		}
	}
	return nil
}

// linkText is the LINK column of beam peer list for a peer's link state.
func linkText(l federation.LinkState) string {
	var link string
	switch {
	case l.Connected != nil && !*l.Connected:
		link = "down"
	case l.Connected != nil:
		link = "up"
	default:
		link = "shared NATS"
	}
	switch {
	case l.Failing == 1:
		link += " (1 send retrying)"
	case l.Failing > 1:
		link += fmt.Sprintf(" (%d sends retrying)", l.Failing)
	}
	return link
}

// peerLinks returns the live link state of each peer by domain, or nil when
// the directory does not say (the column then reads "unknown").
func peerLinks(ctx context.Context, of *operatorFlags) map[string]federation.LinkState {
	data, _, err := of.call(ctx, http.MethodGet, "/observability/federation", nil, nil)
	if err != nil {
		return nil
	}
	var card struct {
		Status struct {
			Links []federation.LinkState `json:"links"`
		} `json:"status"`
	}
	if json.Unmarshal(data, &card) != nil {
		return nil
	}
	out := make(map[string]federation.LinkState, len(card.Status.Links))
	for _, l := range card.Status.Links {
		out[l.Peer] = l
	}
	return out
}
