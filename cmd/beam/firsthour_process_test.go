package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// cliRunner runs beam commands against one directory process from a
// working directory of their own.
type cliRunner struct {
	t   *testing.T
	ctx context.Context
	dir string
	env []string
}

func newCLIRunner(t *testing.T, p *beamtest.Process) *cliRunner {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &cliRunner{t: t, ctx: ctx, dir: t.TempDir(), env: append(os.Environ(), "BEAM_URL="+p.URL())}
}

// try runs beam args and returns its combined output and whether it exited 0.
func (r *cliRunner) try(args ...string) (string, bool) {
	r.t.Helper()
	cmd := exec.CommandContext(r.ctx, beamtest.Binary(r.t), args...)
	cmd.Dir, cmd.Env = r.dir, r.env
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// ok runs beam args and fails the test when it exits non-zero.
func (r *cliRunner) ok(args ...string) string {
	r.t.Helper()
	out, ok := r.try(args...)
	require.True(r.t, ok, "beam %s:\n%s", strings.Join(args, " "), out)
	return out
}

// fail runs beam args and fails the test when it exits 0.
func (r *cliRunner) fail(args ...string) string {
	r.t.Helper()
	out, ok := r.try(args...)
	require.False(r.t, ok, "beam %s succeeded:\n%s", strings.Join(args, " "), out)
	return out
}

// agent creates and registers an identity file name.json for id.
func (r *cliRunner) agent(name, id string) string {
	r.t.Helper()
	file := name + ".json"
	r.ok("keygen", "--beam-id", id, "--out", file)
	r.ok("register", "--identity", file, "--name", name)
	return file
}

// durableReceipt is the first line beam send --durable prints.
type durableReceipt struct {
	Nonce  string `json:"nonce"`
	Status string `json:"status"`
}

// sendDurable runs beam send args --durable (the flag after the
// positional arguments) and returns its receipt and output.
func (r *cliRunner) sendDurable(args ...string) (durableReceipt, string) {
	r.t.Helper()
	out := r.ok(append(append([]string{"send"}, args...), "--durable")...)
	var rec durableReceipt
	require.NoError(r.t, json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &rec), out)
	return rec, out
}

// claimedMessage is a message beam poll --claim handed out.
type claimedMessage struct {
	ID      string `json:"id"`
	LeaseID string `json:"lease_id"`
}

// claim runs beam poll --claim args and returns the last message.
func (r *cliRunner) claim(args ...string) claimedMessage {
	r.t.Helper()
	out := r.ok(append([]string{"poll", "--claim"}, args...)...)
	var msg claimedMessage
	require.NoError(r.t, json.Unmarshal([]byte(lastLine(out)), &msg), out)
	require.NotEmpty(r.t, msg.LeaseID, out)
	return msg
}

func TestServePrintsWhereTheOperatorTokenIs(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--demo"}})
	path := filepath.Join(p.DataDir, "admin.token")
	tok, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(p.Output(), "demo agents running") }, 30*time.Second, 20*time.Millisecond)
	first := p.Output()
	require.Contains(t, first, "operator token (stored in "+path+", shown once): "+strings.TrimSpace(string(tok)))
	require.Contains(t, first, "dashboard: "+p.URL()+"/dashboard/")

	// "/" is an index for non-HTML clients.
	var idx struct {
		Links map[string]string `json:"links"`
	}
	status, err := httpGetJSON(p.URL()+"/", &idx)
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.Equal(t, "/health", idx.Links["health"])
	require.Equal(t, "/dashboard/", idx.Links["dashboard"])

	p.Restart()
	// The demo line is the last of a start's lines.
	require.Eventually(t, func() bool { return strings.Count(p.Output(), "demo agents running") == 2 }, 30*time.Second, 20*time.Millisecond)
	second := p.Output()[len(first):]
	require.NotContains(t, second, strings.TrimSpace(string(tok)))
	require.Contains(t, second, "operator token: in "+path+" (cat it; operator commands read it with --data-dir)")
	// Every secret of the data directory says where it is.
	require.Contains(t, second, "intent bus BUS_SECRET: in "+filepath.Join(p.DataDir, "intent.secret")+" (cat it; job bus clients send it as X-API-KEY)")
	require.Contains(t, second, "read-only viewer token: in "+filepath.Join(p.DataDir, "viewer.token")+" (cat it; it signs in to the dashboard to read)")
	require.Contains(t, second, "sign in with the operator token, in "+path+" (cat it;")
}

func TestSendToUnknownAndOfflineAgents(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--open-orgs"}})
	r := newCLIRunner(t, p)
	r.agent("bob", "bob@acme.beam.directory")
	alice := r.agent("alice", "alice@acme.beam.directory")

	out := r.fail("send", "--identity", alice, "nobody@acme.beam.directory", "conversation.message", `{"message":"hi"}`)
	require.Contains(t, out, "UNKNOWN_AGENT (HTTP 404)")
	require.Contains(t, out, "nobody@acme.beam.directory is not registered with this directory")
	out = r.fail("send", "--identity", alice, "--durable", "nobody@acme.beam.directory", "conversation.message", `{"message":"hi"}`)
	require.Contains(t, out, "UNKNOWN_AGENT")

	// bob is registered but not connected.
	out = r.fail("send", "--identity", alice, "bob@acme.beam.directory", "conversation.message", `{"message":"hi"}`)
	require.Contains(t, out, "OFFLINE (HTTP 503)")
	require.Regexp(t, `\nnonce \S+: beam trace \S+ shows its events`, out)
}

func TestBusCommandsSayWhatToDoNext(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--open-orgs"}})
	r := newCLIRunner(t, p)
	bob := r.agent("bob", "bob@acme.beam.directory")
	alice := r.agent("alice", "alice@acme.beam.directory")
	rec, out := r.sendDurable("--identity", alice, "bob@acme.beam.directory", "conversation.message", `{"message":"later"}`)
	require.Equal(t, "queued", rec.Status)
	require.Contains(t, out, "stored (queued); the outcome comes later: beam trace "+rec.Nonce+" (--data-dir of the directory, or --url) shows it, beam dead-letters lists it if every retry fails")

	out = r.ok("poll", "--identity", bob)
	require.Equal(t, "no delivered messages to ack; 1 queued (beam poll --status queued lists them, beam poll --claim takes them under a lease)\n", out)

	// --lease in plain seconds, as the README writes it; flags after nothing positional.
	msg := r.claim("--identity", bob, "--lease", "60")

	out = r.fail("ack", "--identity", bob, msg.ID)
	require.Contains(t, out, "pass --lease-id with the lease_id that beam poll --claim printed for it")
	r.ok("ack", "--identity", bob, msg.ID, "--lease-id", msg.LeaseID)
}

func TestOperatorCommandsAuthenticateOneWay(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	r := newCLIRunner(t, p)
	tok, err := os.ReadFile(filepath.Join(p.DataDir, "admin.token"))
	require.NoError(t, err)
	token := strings.TrimSpace(string(tok))

	out := r.fail("dead-letters", "--data-dir", r.dir)
	require.Contains(t, out, "no operator token: pass --admin-token TOKEN, set BEAM_ADMIN_TOKEN, or point --data-dir at the directory's data directory")
	require.Equal(t, "no dead-lettered messages\n", r.ok("dead-letters", "--data-dir", p.DataDir))
	r.ok("dead-letters", "--admin-token", token)
	r.env = append(r.env, "BEAM_ADMIN_TOKEN="+token)
	r.ok("dead-letters")

	out = r.fail("requeue", "no-such-nonce")
	require.Contains(t, out, `no bus message has the id or nonce "no-such-nonce"; beam dead-letters lists dead-lettered messages with their id and nonce`)

	out = r.fail("peer", "list")
	require.Contains(t, out, "federation is off on the directory at "+p.URL()+": start beam serve with --domain DOMAIN and --nats-listen HOST:PORT")

	// trace says where it looked, and can ask the running server.
	alice := r.agent("alice", "alice@acme.beam.directory")
	out = r.ok("send", "--identity", alice, "echo@beam.directory", "conversation.message", `{"message":"hi"}`)
	var res struct {
		Nonce string `json:"nonce"`
	}
	require.NoError(t, json.Unmarshal([]byte(lastLine(out)), &res), out)
	out = r.ok("trace", "--data-dir", p.DataDir, res.Nonce)
	require.Contains(t, out, "reading the log in data directory "+p.DataDir)
	require.Contains(t, out, "acked")
	out = r.ok("trace", "--url", p.URL(), res.Nonce)
	require.Contains(t, out, "asking the directory at "+p.URL())
	require.Contains(t, out, "nonce "+res.Nonce+"  alice@acme.beam.directory -> echo@beam.directory  intent conversation.message")
	require.Contains(t, out, "acked")
	out = r.fail("trace", "--data-dir", r.dir, res.Nonce)
	require.Contains(t, out, "in data directory "+r.dir)

	// Nothing listens here.
	out = r.fail("peer", "list", "--url", "http://127.0.0.1:1")
	require.Contains(t, out, "cannot reach the directory at http://127.0.0.1:1 (is beam serve running there?")
}

func TestACLCommands(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	r := newCLIRunner(t, p)
	bob := r.agent("bob", "bob@acme.beam.directory")
	mallory := r.agent("mallory", "mallory@evil.beam.directory")
	send := []string{"send", "--identity", mallory, "bob@acme.beam.directory", "conversation.message", `{"message":"hi"}`}

	require.Contains(t, r.fail(send...), "FORBIDDEN")
	r.ok("acl", "add", "--identity", bob, "--intent", "conversation.message", "mallory@evil.beam.directory")
	out := r.ok("acl", "list", "--identity", bob)
	var rule struct {
		ID          int64  `json:"id"`
		AllowedFrom string `json:"allowed_from"`
		IntentType  string `json:"intent_type"`
	}
	require.NoError(t, json.Unmarshal([]byte(lastLine(out)), &rule), out)
	require.Equal(t, "mallory@evil.beam.directory", rule.AllowedFrom)
	require.Equal(t, "conversation.message", rule.IntentType)
	// The rule lets mallory through the policy: bob is merely offline now.
	require.Contains(t, r.fail(send...), "OFFLINE")

	r.ok("acl", "remove", "--identity", bob, strconv.FormatInt(rule.ID, 10))
	require.Contains(t, r.fail(send...), "FORBIDDEN")

	out = r.fail("acl", "remove", "--identity", bob, "first")
	require.Contains(t, out, `rule id "first" is not a number: beam acl list prints the ids`)
}

// A start that fails after the data directory exists leaves no secret that
// was never printed: the next start generates the operator token and
// prints it.
func TestFailedStartLeavesNoUnprintedToken(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	addr := busy.Addr().String()
	requireNoSecrets := func() {
		t.Helper()
		for _, name := range []string{"admin.token", "viewer.token", "intent.secret"} {
			_, err := os.Stat(filepath.Join(dir, name))
			require.ErrorIs(t, err, os.ErrNotExist, name)
		}
	}
	ctx := context.Background()

	out, err := beamtest.Run(t, ctx, "serve", "--data-dir", dir, "--listen", addr, "--intent-listen", "127.0.0.1:0")
	require.Error(t, err)
	require.Contains(t, out, "beam serve: listen: listen tcp "+addr+": bind: address already in use (is another beam serve running there? --listen sets the address)\n")
	require.NotContains(t, out, "operator token")
	requireNoSecrets()

	out, err = beamtest.Run(t, ctx, "serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--intent-listen", addr)
	require.Error(t, err)
	require.Contains(t, out, "beam serve: intent listen: listen tcp "+addr+": bind: address already in use (--intent-listen sets the address; empty turns the job bus off)\n")
	requireNoSecrets()

	out, err = beamtest.Run(t, ctx, "serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--default-policy", "maybe")
	require.Error(t, err)
	require.Contains(t, out, `beam serve: default policy "maybe": want same-org, allow or deny`)
	requireNoSecrets()

	p := beamtest.Start(t, beamtest.Options{DataDir: dir})
	tok, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	require.NoError(t, err)
	require.Contains(t, p.Output(), "operator token (stored in "+filepath.Join(dir, "admin.token")+", shown once): "+strings.TrimSpace(string(tok))+"\n")
	viewer, err := os.ReadFile(filepath.Join(dir, "viewer.token"))
	require.NoError(t, err)
	require.Contains(t, p.Output(), "read-only viewer token (stored in "+filepath.Join(dir, "viewer.token")+", shown once): "+strings.TrimSpace(string(viewer))+"\n")
}

// beam requeue takes the nonce that beam send printed as well as the
// message id, of a dead-lettered or a failed message.
func TestRequeueByNonceOrID(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--open-orgs"}})
	r := newCLIRunner(t, p)
	bob := r.agent("bob", "bob@acme.beam.directory")
	alice := r.agent("alice", "alice@acme.beam.directory")
	// failed sends a durable message that bob fails.
	failed := func() (id, nonce string) {
		rec, _ := r.sendDurable("--identity", alice, "bob@acme.beam.directory", "conversation.message", `{"message":"later"}`)
		msg := r.claim("--identity", bob)
		require.Contains(t, r.ok("ack", "--identity", bob, msg.ID, "--lease-id", msg.LeaseID, "--status", "failed"), `"status":"failed"`)
		return msg.ID, rec.Nonce
	}

	_, nonce := failed()
	out := r.ok("requeue", "--data-dir", p.DataDir, nonce)
	require.Contains(t, out, `"nonce":"`+nonce+`","requeued":true,"retry_count":0,"status":"queued"`)

	id, nonce := failed()
	out = r.ok("requeue", id, "--data-dir", p.DataDir)
	require.Contains(t, out, `"nonce":"`+nonce+`","requeued":true,"retry_count":0,"status":"queued"`)

	// Queued again: nothing to requeue.
	out = r.fail("requeue", nonce, "--data-dir", p.DataDir)
	require.Contains(t, out, "(HTTP 409)")
}
