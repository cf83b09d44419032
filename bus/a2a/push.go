package a2a

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// Push notifications: a task's owner registers webhooks (push notification
// configs); the server POSTs the task to each at every change of its
// status and at its end. A config is the owner's and the server's only:
// it is kept in a2a_push_configs (written through the log's writer, never
// in the envelope an actor receives), and its URL follows the rules of an
// agent's httpEndpoint, dialled by the directory's outbound client (public
// addresses only unless --allow-private-endpoints).

// Bounds of push notifications.
const (
	maxPushConfigs   = 10 // per task
	maxPushToken     = 1024
	maxPushCreds     = 4096
	maxPushID        = 128
	pushTimeout      = 5 * time.Second
	pushAttempts     = 3
	pushRetryDelay   = 250 * time.Millisecond
	maxPushReplyRead = 4 << 10
	// headerNotificationToken carries a config's token on each notification.
	headerNotificationToken = "X-A2A-Notification-Token"
)

const pushSchema = `
CREATE TABLE IF NOT EXISTS a2a_push_configs(
  task_id    TEXT NOT NULL,
  config_id  TEXT NOT NULL,
  owner      TEXT NOT NULL,
  version    INTEGER NOT NULL,
  config     TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY(task_id, config_id)
);
`

// pushConfig is one webhook of a task (1.0's TaskPushNotificationConfig
// without taskId; 0.3's PushNotificationConfig).
type pushConfig struct {
	ID             string    `json:"id"`
	URL            string    `json:"url"`
	Token          string    `json:"token,omitempty"`
	Authentication *pushAuth `json:"authentication,omitempty"`
}

// pushAuth is 1.0's AuthenticationInfo (scheme) and 0.3's
// PushNotificationAuthenticationInfo (schemes).
type pushAuth struct {
	Scheme      string   `json:"scheme,omitempty"`
	Schemes     []string `json:"schemes,omitempty"`
	Credentials string   `json:"credentials,omitempty"`
}

// authorization is the Authorization header value of a config, "" for
// none.
func (c pushConfig) authorization() string {
	a := c.Authentication
	if a == nil || a.Credentials == "" {
		return ""
	}
	scheme := a.Scheme
	if scheme == "" && len(a.Schemes) > 0 {
		scheme = a.Schemes[0]
	}
	if scheme == "" {
		scheme = "Bearer"
	}
	return scheme + " " + a.Credentials
}

// pushEntry is a stored config with its version (the shape of its
// notifications).
type pushEntry struct {
	cfg pushConfig
	v   version
}

// pushes holds the configs of open tasks and the followers that notify
// them.
type pushes struct {
	mu      sync.Mutex
	configs map[string][]pushEntry // task id → configs, in creation order
	active  map[string]bool        // task ids with a follower
	client  *http.Client
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// openPushes creates the table, loads the configs and starts following
// the open tasks that have some.
func (s *Server) openPushes() error {
	ctx, cancel := context.WithCancel(context.Background())
	s.push = &pushes{configs: map[string][]pushEntry{}, active: map[string]bool{}, ctx: ctx, cancel: cancel,
		client: directory.OutboundClient(pushTimeout, s.cfg.AllowPrivateWebhooks)}
	if s.cfg.Log == nil {
		return nil
	}
	octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
	defer ocancel()
	if _, err := s.cfg.Log.Do(octx, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(pushSchema)
		return err
	}); err != nil {
		return fmt.Errorf("create push config table: %w", err)
	}
	var rows []struct {
		TaskID  string `db:"task_id"`
		Version int    `db:"version"`
		Config  string `db:"config"`
	}
	if err := s.cfg.Log.ReadDB().SelectContext(octx, &rows,
		`SELECT task_id, version, config FROM a2a_push_configs ORDER BY created_at, config_id`); err != nil {
		return fmt.Errorf("load push configs: %w", err)
	}
	for _, r := range rows {
		var c pushConfig
		if json.Unmarshal([]byte(r.Config), &c) != nil {
			continue
		}
		s.push.configs[r.TaskID] = append(s.push.configs[r.TaskID], pushEntry{cfg: c, v: version(r.Version)})
	}
	for id := range s.push.configs {
		s.follow4Push(id)
	}
	return nil
}

// Close stops the push notification followers (a task's configs stay
// stored: the next start follows its task again).
func (s *Server) Close() {
	s.push.cancel()
	s.push.wg.Wait()
}

// checkWebhook validates a webhook URL: an agent endpoint's rules, and a
// host that is no loopback or private address unless private endpoints
// are allowed (names are checked again on the address dialled).
func (s *Server) checkWebhook(raw string) *a2aError {
	allow := s.cfg.AllowPrivateWebhooks
	if err := registry.ValidateEndpoint(raw, allow); err != nil {
		return errInvalidParams("push notification url: must be an https URL (" + err.Error() + ")")
	}
	if allow {
		return nil
	}
	u, _ := url.Parse(raw)
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return errInvalidParams("push notification url: " + host + " is not a public address")
	}
	if a, err := netip.ParseAddr(host); err == nil && !directory.PublicAddr(a) {
		return errInvalidParams("push notification url: " + host + " is not a public address")
	}
	return nil
}

// checkPushConfig validates c and gives it an id when it has none.
func (s *Server) checkPushConfig(c *pushConfig) *a2aError {
	if c.URL == "" {
		return errInvalidParams("push notification config: url is required")
	}
	if e := s.checkWebhook(c.URL); e != nil {
		return e
	}
	if len(c.Token) > maxPushToken || len(c.ID) > maxPushID {
		return errInvalidParams(fmt.Sprintf("push notification config: id at most %d and token at most %d bytes", maxPushID, maxPushToken))
	}
	if a := c.Authentication; a != nil {
		if len(a.Credentials) > maxPushCreds || len(a.Scheme) > 64 || len(a.Schemes) > 8 {
			return errInvalidParams("push notification config: authentication too large")
		}
		for _, x := range append([]string{a.Scheme, a.Credentials}, a.Schemes...) {
			if strings.ContainsAny(x, "\r\n") {
				return errInvalidParams("push notification config: authentication has a line break")
			}
		}
	}
	if c.ID == "" {
		c.ID = newID()
	}
	return nil
}

// setPush stores config c of task id (replacing one with its id) and
// makes sure the task is followed.
func (s *Server) setPush(ctx context.Context, caller, id string, v version, c *pushConfig) error {
	if e := s.checkPushConfig(c); e != nil {
		return e
	}
	s.push.mu.Lock()
	n := 0
	for _, e := range s.push.configs[id] {
		if e.cfg.ID != c.ID {
			n++
		}
	}
	s.push.mu.Unlock()
	if n >= maxPushConfigs {
		return errInvalidParams(fmt.Sprintf("a task has at most %d push notification configs", maxPushConfigs))
	}
	raw, err := json.Marshal(*c)
	if err != nil {
		return fmt.Errorf("encode push config: %w", err)
	}
	if s.cfg.Log != nil {
		if _, err := s.cfg.Log.Do(ctx, func(tx *sqlx.Tx) error {
			_, err := tx.Exec(`INSERT INTO a2a_push_configs(task_id, config_id, owner, version, config, created_at)
			  VALUES(?,?,?,?,?,?) ON CONFLICT(task_id, config_id) DO UPDATE SET config = excluded.config, version = excluded.version`,
				id, c.ID, caller, int(v), string(raw), time.Now().UnixMilli())
			return err
		}); err != nil {
			return fmt.Errorf("store push config: %w", err)
		}
	}
	s.push.mu.Lock()
	list := s.push.configs[id][:0:0]
	for _, e := range s.push.configs[id] {
		if e.cfg.ID != c.ID {
			list = append(list, e)
		}
	}
	s.push.configs[id] = append(list, pushEntry{cfg: *c, v: v})
	s.push.mu.Unlock()
	s.follow4Push(id)
	return nil
}

// pushList returns the configs of task id.
func (s *Server) pushList(id string) []pushEntry {
	s.push.mu.Lock()
	defer s.push.mu.Unlock()
	return append([]pushEntry(nil), s.push.configs[id]...)
}

// deletePush removes config cid of task id; it reports whether there was
// one.
func (s *Server) deletePush(ctx context.Context, id, cid string) (bool, error) {
	found := false
	for _, e := range s.pushList(id) {
		found = found || e.cfg.ID == cid
	}
	if !found {
		return false, nil
	}
	if s.cfg.Log != nil {
		if _, err := s.cfg.Log.Do(ctx, func(tx *sqlx.Tx) error {
			_, err := tx.Exec(`DELETE FROM a2a_push_configs WHERE task_id = ? AND config_id = ?`, id, cid)
			return err
		}); err != nil {
			return false, fmt.Errorf("delete push config: %w", err)
		}
	}
	s.push.mu.Lock()
	list := s.push.configs[id][:0:0]
	for _, e := range s.push.configs[id] {
		if e.cfg.ID != cid {
			list = append(list, e)
		}
	}
	if len(list) == 0 {
		delete(s.push.configs, id)
	} else {
		s.push.configs[id] = list
	}
	s.push.mu.Unlock()
	return true, nil
}

// follow4Push starts the follower of task id unless it runs: it notifies
// the task's configs at each change of status, ending after the terminal
// one, then forgets the task's configs.
func (s *Server) follow4Push(id string) {
	p := s.push
	p.mu.Lock()
	if p.active[id] || p.ctx.Err() != nil {
		p.mu.Unlock()
		return
	}
	p.active[id] = true
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		var last tracing.MeshStatus
		row, err := s.cfg.Mesh.Follow(p.ctx, id, func(row tracing.MeshRow) bool {
			if row.Status != last {
				last = row.Status
				s.notifyPush(p.ctx, row)
			}
			return row.Status.Terminal()
		})
		p.mu.Lock()
		delete(p.active, id)
		p.mu.Unlock()
		if err == nil && row.Status.Terminal() {
			s.forgetPush(id)
		}
	}()
}

// forgetPush drops the configs of a finished task.
func (s *Server) forgetPush(id string) {
	if s.cfg.Log != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := s.cfg.Log.Do(ctx, func(tx *sqlx.Tx) error {
			_, err := tx.Exec(`DELETE FROM a2a_push_configs WHERE task_id = ?`, id)
			return err
		}); err != nil {
			s.lg.Warn("a2a forget push configs", "task", id, "err", err)
			return
		}
	}
	s.push.mu.Lock()
	delete(s.push.configs, id)
	s.push.mu.Unlock()
}

// notifyPush POSTs row's task to every config of its task.
func (s *Server) notifyPush(ctx context.Context, row tracing.MeshRow) {
	for _, e := range s.pushList(row.ID) {
		t := taskOf(e.v, row, true)
		var body any = t
		if e.v == v10 {
			body = map[string]any{"task": t} // a StreamResponse
		}
		raw, err := json.Marshal(body)
		if err != nil {
			continue
		}
		if err := s.postPush(ctx, e.cfg, raw); err != nil {
			s.lg.Info("a2a push notification not delivered", "task", row.ID, "config", e.cfg.ID, "err", err)
		}
	}
}

// postPush delivers one notification with bounded retries.
func (s *Server) postPush(ctx context.Context, c pushConfig, body []byte) error {
	var err error
	for attempt := range pushAttempts {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pushRetryDelay << (attempt - 1)):
			}
		}
		if err = s.postPushOnce(ctx, c, body); err == nil {
			return nil
		}
	}
	return err
}

func (s *Server) postPushOnce(ctx context.Context, c pushConfig, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set(headerNotificationToken, c.Token)
	}
	if a := c.authorization(); a != "" {
		req.Header.Set("Authorization", a)
	}
	resp, err := s.push.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxPushReplyRead))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook answered HTTP %d", resp.StatusCode)
	}
	return nil
}

// taskPushConfig is a config as the calls exchange it: 1.0's flat
// TaskPushNotificationConfig, or 0.3's {taskId, pushNotificationConfig}.
type taskPushConfig struct {
	TaskID string `json:"taskId"`
	pushConfig
	Nested *pushConfig `json:"pushNotificationConfig,omitempty"`
}

// config returns the webhook config it carries.
func (t taskPushConfig) config() pushConfig {
	if t.Nested != nil {
		return *t.Nested
	}
	return t.pushConfig
}

// pushView is a stored config in the shape of version v.
func pushView(v version, taskID string, c pushConfig) any {
	if v == v03 {
		return map[string]any{"taskId": taskID, "pushNotificationConfig": c}
	}
	return taskPushConfig{TaskID: taskID, pushConfig: c}
}

// Push notification config operations.
const (
	pushCreate = "create"
	pushGet    = "get"
	pushList   = "list"
	pushDelete = "delete"
)

// pushOps maps the methods of both versions to their operation.
var pushOps = map[string]string{
	"CreateTaskPushNotificationConfig": pushCreate, "tasks/pushNotificationConfig/set": pushCreate,
	"GetTaskPushNotificationConfig": pushGet, "tasks/pushNotificationConfig/get": pushGet,
	"ListTaskPushNotificationConfigs": pushList, "ListTaskPushNotificationConfig": pushList,
	"tasks/pushNotificationConfig/list": pushList,
	"DeleteTaskPushNotificationConfig":  pushDelete, "tasks/pushNotificationConfig/delete": pushDelete,
}

// pushRPC answers the push notification config methods.
func (s *Server) pushRPC(ctx context.Context, w http.ResponseWriter, c rpcCall, pipe *mesh.Pipeline) {
	var p struct {
		taskPushConfig
		ID                       string `json:"id"`
		PushNotificationConfigID string `json:"pushNotificationConfigId"`
	}
	if err := json.Unmarshal(c.params, &p); err != nil {
		writeRPC(w, c.req.ID, nil, errInvalidParams("params: "+err.Error()))
		return
	}
	// 1.0 names the task taskId and the config id; 0.3 names the task id
	// and the config pushNotificationConfigId.
	taskID, cid := p.TaskID, p.ID
	if c.v == v03 {
		taskID, cid = cmp.Or(p.TaskID, p.ID), p.PushNotificationConfigID
	}
	cfg := p.config()
	if c.v == v10 {
		cfg.ID = p.ID
	}
	res, err := s.pushOp(ctx, c.caller, pipe, pushOps[c.req.Method], c.v, taskID, cid, cfg)
	if err != nil {
		writeRPC(w, c.req.ID, nil, s.asError(err))
		return
	}
	writeRPC(w, c.req.ID, res, nil)
}

// handleRESTPush serves the HTTP+JSON binding's push notification config
// routes: POST and GET tasks/{task}/pushNotificationConfigs, GET and DELETE
// tasks/{task}/pushNotificationConfigs/{config}.
func (s *Server) handleRESTPush(w http.ResponseWriter, r *http.Request) {
	caller, ok := s.restCaller(w, r)
	if !ok {
		return
	}
	pipe, _ := s.pipeline(r)
	taskID, cid := r.PathValue("task"), r.PathValue("config")
	var cfg pushConfig
	op := pushGet
	switch {
	case r.Method == http.MethodPost:
		op = pushCreate
		var p taskPushConfig
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&p); err != nil {
			restError(w, errInvalidParams("the body is not a TaskPushNotificationConfig: "+err.Error()))
			return
		}
		cfg = p.config()
	case r.Method == http.MethodDelete:
		op = pushDelete
	case cid == "":
		op = pushList
	}
	res, err := s.pushOp(r.Context(), caller, pipe, op, v10, taskID, cid, cfg)
	if err != nil {
		restError(w, s.asError(err))
		return
	}
	httpjson.Write(w, http.StatusOK, res)
}

// pushOp runs one push notification config operation on task taskID of
// caller (through pipe, when set) and returns its result in the shape of
// version v.
func (s *Server) pushOp(ctx context.Context, caller string, pipe *mesh.Pipeline, op string, v version, taskID, cid string, cfg pushConfig) (any, error) {
	if taskID == "" {
		return nil, errInvalidParams("the task id is required")
	}
	if _, err := s.visible(ctx, caller, pipe, taskID); err != nil {
		return nil, err
	}
	switch op {
	case pushCreate:
		if err := s.setPush(ctx, caller, taskID, v, &cfg); err != nil {
			return nil, err
		}
		return pushView(v, taskID, cfg), nil
	case pushGet:
		for _, e := range s.pushList(taskID) {
			if cid == "" || e.cfg.ID == cid {
				return pushView(v, taskID, e.cfg), nil
			}
		}
		return nil, errConfigNotFound(taskID, cid)
	case pushList:
		list := s.pushList(taskID)
		views := make([]any, len(list))
		for i, e := range list {
			views[i] = pushView(v, taskID, e.cfg)
		}
		if v == v03 {
			return views, nil
		}
		return map[string]any{"configs": views, "nextPageToken": ""}, nil
	default:
		found, err := s.deletePush(ctx, taskID, cid)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, errConfigNotFound(taskID, cid)
		}
		if v == v03 {
			return json.RawMessage("null"), nil
		}
		return map[string]any{}, nil
	}
}

func errConfigNotFound(taskID, cid string) *a2aError {
	e := errTaskNotFound(taskID)
	e.Msg = "no push notification config " + cid + " on task " + taskID
	return e
}
