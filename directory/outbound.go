package directory

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// This file builds the HTTP client of direct-http deliveries. An agent
// chooses its httpEndpoint, and the directory returns the endpoint's answer
// to the sender, so without limits any registrant could make the directory
// fetch internal URLs and read the answers back (SSRF). The client
//
//   - dials only public unicast addresses, checked on the address actually
//     dialled (after DNS resolution, so a name that re-resolves to an
//     internal address is refused too), unless Config.AllowPrivateEndpoints;
//   - follows at most maxEndpointRedirects redirects, each to the same host
//     and never from https to http;
//   - uses no proxy from the environment.
//
// Errors it returns are for the operator's log; the sender only ever sees
// a generic reason (directFailure).

// maxEndpointRedirects bounds the redirects of one direct-http delivery.
const maxEndpointRedirects = 3

// errEndpointNotPublic is returned when a delivery would dial an address
// that is not public.
var errEndpointNotPublic = errors.New("endpoint address is not public")

// errEndpointRedirect is returned for a refused redirect.
var errEndpointRedirect = errors.New("endpoint redirect refused")

// endpointClient returns the client direct-http deliveries use: base's
// transport and TLS settings (a default transport when base is nil) with the
// address and redirect rules above.
func endpointClient(base *http.Client, timeout time.Duration, allowPrivate bool) *http.Client {
	var tr *http.Transport
	if base != nil {
		if t, ok := base.Transport.(*http.Transport); ok {
			tr = t.Clone()
		}
	}
	if tr == nil {
		tr = http.DefaultTransport.(*http.Transport).Clone()
	}
	tr.Proxy = nil
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !PublicAddr(ap.Addr()) {
				return errEndpointNotPublic
			}
			return nil
		}
	}
	tr.DialContext = dialer.DialContext
	tr.DialTLSContext = nil
	c := &http.Client{Transport: tr, Timeout: timeout}
	if base != nil && base.Timeout > 0 {
		c.Timeout = base.Timeout
	}
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) > maxEndpointRedirects {
			return fmt.Errorf("%w: more than %d redirects", errEndpointRedirect, maxEndpointRedirects)
		}
		first := via[0].URL
		if req.URL.Host != first.Host {
			return fmt.Errorf("%w: to another host", errEndpointRedirect)
		}
		if first.Scheme == "https" && req.URL.Scheme != "https" {
			return fmt.Errorf("%w: from https to %s", errEndpointRedirect, req.URL.Scheme)
		}
		return nil
	}
	return c
}

// OutboundClient returns a client with the address and redirect rules of
// direct-http deliveries (public addresses only unless allowPrivate), for
// other outbound requests to URLs that clients choose (A2A push
// notification webhooks).
func OutboundClient(timeout time.Duration, allowPrivate bool) *http.Client {
	return endpointClient(nil, timeout, allowPrivate)
}

// nonPublic are the prefixes a direct-http delivery never dials by default:
// loopback, private, shared (CGNAT), link-local, unique-local, multicast,
// unspecified, documentation, benchmarking and reserved ranges, and the
// IPv6 forms that embed an IPv4 address (checked on the embedded address).
var nonPublic = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
		"192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
		"::/128", "::1/128", "100::/64", "2001:db8::/32", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// IPv6 prefixes that embed an IPv4 address.
var (
	nat64        = netip.MustParsePrefix("64:ff9b::/96")
	v4Compatible = netip.MustParsePrefix("::/96")
	sixToFour    = netip.MustParsePrefix("2002::/16")
)

// PublicAddr reports whether a is a public unicast address a direct-http
// delivery may dial without --allow-private-endpoints. IPv4-mapped,
// IPv4-compatible, NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses are
// judged by the IPv4 address they carry.
func PublicAddr(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a), v4Compatible.Contains(a):
			return PublicAddr(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
		case sixToFour.Contains(a):
			return PublicAddr(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
		}
	}
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsMulticast() || a.IsUnspecified() || a.IsInterfaceLocalMulticast() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// directFailure is the reason of a failed direct-http delivery as the
// sender and the trace see it: a category, never a transport error, an
// address or a certificate name.
func directFailure(err error) string {
	var status *endpointStatusError
	switch {
	case errors.Is(err, errEndpointNotPublic):
		return "endpoint address is not allowed"
	case errors.Is(err, errEndpointRedirect):
		return "endpoint redirect refused"
	case errors.As(err, &status):
		return fmt.Sprintf("endpoint answered HTTP %d", status.code)
	case errors.Is(err, errEndpointResponse):
		return "endpoint response is not usable"
	case errors.Is(err, context.DeadlineExceeded):
		return "endpoint did not answer in time"
	default:
		return "endpoint could not be reached"
	}
}

// endpointStatusError is a non-2xx answer of an endpoint.
type endpointStatusError struct{ code int }

func (e *endpointStatusError) Error() string { return fmt.Sprintf("endpoint answered HTTP %d", e.code) }

// errEndpointResponse marks an answer that cannot be mapped to a result.
var errEndpointResponse = errors.New("endpoint response")
