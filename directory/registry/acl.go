package registry

import (
	"fmt"
	"strings"

	"github.com/beamdir/beam/agents/wire"
)

// Rule effects.
const (
	effectAllow = "allow"
	effectDeny  = "deny"
)

// Allowed decides whether from may send an intent of intentType to to,
// and says why. It never touches SQLite. See the package doc for the rules.
func (r *Registry) Allowed(from, to, intentType string) (bool, string) {
	r.mu.RLock()
	rules := r.rules[to]
	outside := ""
	if r.cfg.DefaultPolicy == PolicySameOrg {
		// Only approved members of an org have same-org rights.
		switch {
		case r.members[from] == memberPending:
			outside = from
		case r.members[to] == memberPending:
			outside = to
		}
	}
	r.mu.RUnlock()
	ok, reason := evaluate(rules, r.cfg.DefaultPolicy, from, to, intentType)
	if ok && outside != "" && reason == sameOrgAllowed {
		return false, "denied by same-org default policy (" + outside + " is not an approved member of its org; the org owner or an operator approves members)"
	}
	return ok, reason
}

// sameOrgAllowed is the reason of an intent the same-org default allows.
const sameOrgAllowed = "allowed by same-org default policy"

// evaluate applies rules (all of them protect to) and then policy.
func evaluate(rules []Rule, policy Policy, from, to, intentType string) (bool, string) {
	var allowRule *Rule
	for i := range rules {
		rule := &rules[i]
		if rule.IntentType != "*" && rule.IntentType != intentType {
			continue
		}
		if !patternMatches(rule.AllowedFrom, from) {
			continue
		}
		if rule.Effect == effectDeny {
			return false, fmt.Sprintf("denied by acl rule %d (%s from %s)", rule.ID, rule.IntentType, rule.AllowedFrom)
		}
		if allowRule == nil {
			allowRule = rule
		}
	}
	if allowRule != nil {
		return true, fmt.Sprintf("allowed by acl rule %d (%s from %s)", allowRule.ID, allowRule.IntentType, allowRule.AllowedFrom)
	}
	return defaultDecision(policy, from, to)
}

// defaultDecision applies the default policy.
func defaultDecision(p Policy, from, to string) (bool, string) {
	switch p {
	case PolicyAllow:
		return true, "allowed by default policy"
	case PolicyDeny:
		return false, "denied by default policy (no acl rule allows it)"
	}
	f, err1 := wire.ParseBeamID(from)
	t, err2 := wire.ParseBeamID(to)
	if err1 != nil || err2 != nil {
		return false, "denied by same-org default policy (unparseable beam id)"
	}
	if f.Personal() || t.Personal() {
		return false, "denied by same-org default policy (personal agents belong to no org; add an acl rule)"
	}
	if f.Org != t.Org {
		return false, "denied by same-org default policy (different orgs; add an acl rule)"
	}
	return true, sameOrgAllowed
}

// patternMatches applies an allowed_from pattern to a sender Beam ID.
func patternMatches(pattern, from string) bool {
	switch {
	case pattern == "*":
		return true
	case pattern == from:
		return true
	case strings.HasPrefix(pattern, "*@"), strings.HasPrefix(pattern, "*."):
		// "*@d": from's domain is d; "*.d": from's domain ends in ".d"
		// (a pattern holds no '@', so the suffix lies in the domain).
		return strings.HasSuffix(from, pattern[1:])
	}
	return false
}

// validPattern checks an allowed_from pattern at creation time.
func validPattern(p string) bool {
	if p == "" || len(p) > 255 {
		return false
	}
	if p == "*" {
		return true
	}
	if strings.HasPrefix(p, "*@") || strings.HasPrefix(p, "*.") {
		rest := p[2:]
		if rest == "" {
			return false
		}
		for _, c := range rest {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
				return false
			}
		}
		return true
	}
	_, err := wire.ParseBeamID(p)
	return err == nil
}

// validIntentType checks an ACL intent type: "*" or a plain intent name.
func validIntentType(s string) bool {
	if s == "*" {
		return true
	}
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._:-/", c)) {
			return false
		}
	}
	return true
}
