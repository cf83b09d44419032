package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/beamdir/beam/agents"
)

// operatorFlags are the flags of every operator command (dead-letters,
// requeue, peer add|list|remove, acl as operator): one way to authenticate,
// --admin-token, else BEAM_ADMIN_TOKEN, else the admin.token of --data-dir.
type operatorFlags struct {
	url     string
	token   string
	dataDir string
}

// newOperatorFlags registers the operator flags in fs.
func newOperatorFlags(fs *flag.FlagSet) *operatorFlags {
	f := &operatorFlags{}
	fs.StringVar(&f.url, "url", defaultDirectoryURL, "base URL of the running directory")
	fs.StringVar(&f.token, "admin-token", "", "operator token (default: the admin.token of --data-dir)")
	// The bus key is accepted as well, under its old flag name.
	fs.StringVar(&f.token, "bus-api-key", "", "same as --admin-token (the bus key or the operator token)")
	fs.StringVar(&f.dataDir, "data-dir", "./beam-data", "data directory of the running directory, whose admin.token is used when --admin-token is empty")
	return f
}

// bearer returns the operator token: the flag or BEAM_ADMIN_TOKEN, else the
// data directory's admin.token, else an error saying how to pass one.
func (f *operatorFlags) bearer() (string, error) {
	if f.token != "" {
		return f.token, nil
	}
	path := filepath.Join(f.dataDir, "admin.token")
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("no operator token: pass --admin-token TOKEN, set BEAM_ADMIN_TOKEN, or point --data-dir at the directory's data directory (no readable %s)", path)
	}
	return strings.TrimSpace(string(b)), nil
}

// call performs one operator request (body may be nil) and returns the body
// of a 2xx answer; other answers become errors naming the code and status.
func (f *operatorFlags) call(ctx context.Context, method, path string, query url.Values, body any) ([]byte, int, error) {
	token, err := f.bearer()
	if err != nil {
		return nil, 0, err
	}
	return doJSON(ctx, f.url, token, method, path, query, body)
}

// doJSON performs one request against the directory at base with a bearer
// token. It returns the body and status of a 2xx answer and an error for
// anything else.
func doJSON(ctx context.Context, base, token, method, path string, query url.Values, body any) ([]byte, int, error) {
	u := strings.TrimRight(base, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, 0, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, 0, fmt.Errorf("build request: %w", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, 0, fmt.Errorf("the directory at %s did not answer %s %s in time", base, method, path)
		}
		return nil, 0, fmt.Errorf("cannot reach the directory at %s (is beam serve running there? --url sets the address): %w", base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return data, resp.StatusCode, agents.ErrorFromResponse(resp, data)
	}
	return data, resp.StatusCode, nil
}
