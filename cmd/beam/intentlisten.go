package main

import (
	"fmt"
	"net"
	"strconv"
)

// intentListenAuto is --intent-listen's default: the job bus listens next to
// --listen, so that two directories started with only --listen and
// --data-dir do not collide on a fixed port.
const intentListenAuto = "auto"

// intentPortOffset is how far the job bus's default port is from --listen's.
const intentPortOffset = 100

// intentListenAddr resolves --intent-listen: intentListenAuto becomes the
// --listen host with its port + 100 (port 0 stays 0, a free port); any
// other value, "" (off) included, is kept.
func intentListenAddr(listen, intent string) (string, error) {
	if intent != intentListenAuto {
		return intent, nil
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", fmt.Errorf("--listen %q: the job bus's default port is --listen's + %d, which needs a numeric port; set --intent-listen", listen, intentPortOffset)
	}
	if port == 0 {
		return net.JoinHostPort(host, "0"), nil
	}
	if port+intentPortOffset > 65535 {
		return "", fmt.Errorf("--listen %q: the job bus's default port (%d + %d) is out of range; set --intent-listen", listen, port, intentPortOffset)
	}
	return net.JoinHostPort(host, strconv.Itoa(port+intentPortOffset)), nil
}
