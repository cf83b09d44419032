package registry

import (
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// isoTime renders a server time as the reference does (ISO 8601, ms, Z).
func isoTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format("2006-01-02T15:04:05.000Z")
	return &s
}

// keyEntry is one key in keyState.
type keyEntry struct {
	PublicKey string  `json:"publicKey"`
	Status    string  `json:"status"`
	CreatedAt *string `json:"createdAt"`
	RevokedAt *string `json:"revokedAt,omitempty"`
}

// keyState summarises an agent's key history.
type keyState struct {
	Active  *keyEntry  `json:"active"`
	Revoked []keyEntry `json:"revoked"`
	Keys    []keyEntry `json:"keys"`
	Total   int        `json:"total"`
}

func keyStateOf(a *Agent) keyState {
	ks := keyState{Revoked: []keyEntry{}, Keys: []keyEntry{}}
	for _, k := range a.Keys {
		e := keyEntry{PublicKey: k.PublicKey, Status: "active", CreatedAt: isoTime(k.CreatedAt)}
		if k.Revoked() {
			e.Status = "revoked"
			e.RevokedAt = isoTime(k.RevokedAt)
			ks.Revoked = append(ks.Revoked, e)
		} else if k.PublicKey == a.PublicKeyB64 {
			cp := e
			ks.Active = &cp
		}
		ks.Keys = append(ks.Keys, e)
	}
	ks.Total = len(ks.Keys)
	return ks
}

// publicView is what anyone may see of an agent. It carries the reference's
// snake_case fields plus the camelCase aliases SDK normalizeAgent reads.
type publicView struct {
	BeamID           string   `json:"beam_id"`
	Org              string   `json:"org"`
	Personal         bool     `json:"personal"`
	DisplayName      string   `json:"display_name"`
	Capabilities     []string `json:"capabilities"`
	PublicKey        string   `json:"public_key"`
	DID              string   `json:"did"`
	Description      string   `json:"description"`
	LogoURL          string   `json:"logo_url"`
	Website          string   `json:"website"`
	TrustScore       float64  `json:"trust_score"`
	Verified         bool     `json:"verified"`
	VerificationTier string   `json:"verification_tier"`
	Visibility       string   `json:"visibility"`
	DHPublicKey      string   `json:"dh_public_key"`
	CreatedAt        *string  `json:"created_at"`
	LastSeen         *string  `json:"last_seen"`
	KeyState         keyState `json:"keyState"`

	BeamIDAlias           string  `json:"beamId"`
	DisplayNameAlias      string  `json:"displayName"`
	PublicKeyAlias        string  `json:"publicKey"`
	TrustScoreAlias       float64 `json:"trustScore"`
	VerificationTierAlias string  `json:"verificationTier"`
	CreatedAtAlias        *string `json:"createdAt"`
	LastSeenAlias         *string `json:"lastSeen"`
}

// fullView adds the private fields the agent itself and operators see.
type fullView struct {
	publicView
	Email              string  `json:"email"`
	EmailVerified      bool    `json:"email_verified"`
	HTTPEndpoint       string  `json:"http_endpoint"`
	UpdatedAt          *string `json:"updated_at"`
	HTTPEndpointAlias  string  `json:"httpEndpoint"`
	EmailVerifiedAlias bool    `json:"emailVerified"`
	// RequireSenderSignatures is the agent's setting (settings.go).
	RequireSenderSignatures bool `json:"requireSenderSignatures"`
	// AcceptAttestedPipelineHops is the agent's setting (settings.go).
	AcceptAttestedPipelineHops bool `json:"acceptAttestedPipelineHops"`
}

// registerView is the registration response: the full row and, when one
// was minted, the API key (shown once).
type registerView struct {
	fullView
	APIKey string `json:"apiKey,omitempty"`
	// OrgMembership is the new agent's org state (owner, member, pending);
	// absent for personal agents and re-registrations.
	OrgMembership string `json:"orgMembership,omitempty"`
}

func publicViewOf(a *Agent, now time.Time) publicView {
	trust := a.TrustScore(now)
	caps := a.Capabilities
	if caps == nil {
		caps = []string{}
	}
	return publicView{
		BeamID: a.BeamID, Org: a.Org, Personal: a.Personal, DisplayName: a.DisplayName,
		Capabilities: caps, PublicKey: a.PublicKeyB64, DID: a.did(), Description: a.Description,
		LogoURL: a.LogoURL, Website: a.Website, TrustScore: trust, Verified: a.Verified,
		VerificationTier: a.VerificationTier, Visibility: a.Visibility, DHPublicKey: a.DHPublicKey,
		CreatedAt: isoTime(a.CreatedAt), LastSeen: isoTime(a.LastSeen), KeyState: keyStateOf(a),
		BeamIDAlias: a.BeamID, DisplayNameAlias: a.DisplayName, PublicKeyAlias: a.PublicKeyB64,
		TrustScoreAlias: trust, VerificationTierAlias: a.VerificationTier,
		CreatedAtAlias: isoTime(a.CreatedAt), LastSeenAlias: isoTime(a.LastSeen),
	}
}

func fullViewOf(a *Agent, now time.Time) fullView {
	return fullView{
		publicView: publicViewOf(a, now), Email: a.Email, EmailVerified: a.EmailVerified,
		HTTPEndpoint: a.HTTPEndpoint, UpdatedAt: isoTime(a.UpdatedAt),
		HTTPEndpointAlias: a.HTTPEndpoint, EmailVerifiedAlias: a.EmailVerified,
		RequireSenderSignatures: a.RequireSenderSignatures, AcceptAttestedPipelineHops: a.AcceptAttestedPipelineHops,
	}
}

// ruleView is an ACL row on the wire.
type ruleView struct {
	ID          int64   `json:"id"`
	Target      string  `json:"target_beam_id"`
	IntentType  string  `json:"intent_type"`
	AllowedFrom string  `json:"allowed_from"`
	Effect      string  `json:"effect"`
	CreatedAt   *string `json:"created_at"`
	CreatedBy   string  `json:"created_by"`
}

func ruleViewOf(r Rule) ruleView {
	return ruleView{ID: r.ID, Target: r.Target, IntentType: r.IntentType, AllowedFrom: r.AllowedFrom,
		Effect: r.Effect, CreatedAt: isoTime(r.CreatedAt), CreatedBy: r.CreatedBy}
}

// DID documents.

type verificationMethod struct {
	ID                 string  `json:"id"`
	Type               string  `json:"type"`
	Controller         string  `json:"controller"`
	PublicKeyMultibase string  `json:"publicKeyMultibase"`
	BeamStatus         string  `json:"beamStatus"`
	BeamRevokedAt      *string `json:"beamRevokedAt,omitempty"`
}

type didDocument struct {
	Context              []string             `json:"@context"`
	ID                   string               `json:"id"`
	AlsoKnownAs          []string             `json:"alsoKnownAs"`
	VerificationMethod   []verificationMethod `json:"verificationMethod"`
	Authentication       []string             `json:"authentication"`
	AssertionMethod      []string             `json:"assertionMethod"`
	CapabilityInvocation []string             `json:"capabilityInvocation"`
	CapabilityDelegation []string             `json:"capabilityDelegation"`
	Created              *string              `json:"created"`
	Updated              *string              `json:"updated"`
}

func didDocumentOf(a *Agent) didDocument {
	did := a.did()
	doc := didDocument{
		Context:              []string{"https://www.w3.org/ns/did/v1", "https://w3id.org/security/suites/ed25519-2020/v1"},
		ID:                   did,
		AlsoKnownAs:          []string{"beam:" + a.BeamID},
		VerificationMethod:   []verificationMethod{},
		Authentication:       []string{},
		AssertionMethod:      []string{},
		CapabilityInvocation: []string{},
		CapabilityDelegation: []string{},
		Created:              isoTime(a.CreatedAt),
		Updated:              isoTime(a.UpdatedAt),
	}
	for _, k := range a.Keys {
		pub, err := wire.ParsePublicKey(k.PublicKey)
		if err != nil {
			continue
		}
		mb := wire.Multibase(pub)
		vm := verificationMethod{ID: did + "#" + mb, Type: "Ed25519VerificationKey2020", Controller: did,
			PublicKeyMultibase: mb, BeamStatus: "active"}
		if k.Revoked() {
			vm.BeamStatus = "revoked"
			vm.BeamRevokedAt = isoTime(k.RevokedAt)
		} else if k.PublicKey == a.PublicKeyB64 {
			doc.Authentication = append(doc.Authentication, vm.ID)
			doc.AssertionMethod = append(doc.AssertionMethod, vm.ID)
			doc.CapabilityInvocation = append(doc.CapabilityInvocation, vm.ID)
			doc.CapabilityDelegation = append(doc.CapabilityDelegation, vm.ID)
		}
		doc.VerificationMethod = append(doc.VerificationMethod, vm)
	}
	return doc
}
