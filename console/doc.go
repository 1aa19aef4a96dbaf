// Package console is idemkit's web console for operators: an http.Handler a
// service mounts in its own mux, showing what idemkit keeps in PostgreSQL
// and Kafka — the overview idemkit status prints, dead letters with their
// state and history, the outbox, consumers' positions and parked keys,
// stuck HTTP idempotency records — and taking the actions the CLI takes:
// replaying dead letters (always a dry run first), retrying dead outbox
// messages and parked keys, settling stuck records.
//
//	c, err := console.New(pool, &console.Config{
//		Kafka:     kc,
//		Tables:    migrate.Tables{Schema: "orders"},
//		Authorize: yourSSO, // func(*http.Request) (console.Principal, error)
//		BasePath:  "/console",
//	})
//	mux.Handle("/console/", c)
//
// It reads and acts through idemkit's own packages (monitor, dlq, outbox,
// consumer, idemhttp), the code the CLI runs; payloads are redacted as the
// CLI redacts them (card numbers, sensitive fields, tokens).
//
// Contract:
//   - No anonymous access: Config.Authorize is required and decides every
//     request but the sign-in page and the static files. TokenAuth admits
//     a shared token (the standalone command, cmd/idemkit-console, uses it).
//     The sign-in page checks a token with Authorize and opens a session:
//     its cookie holds the principal and an expiry signed with
//     Config.Secret, never the token; sign-out revokes it.
//   - Every action is a POST carrying a form token: an HMAC, bound to the
//     principal and the action (a replay's to the selection of the dry run
//     that issued it), valid for Config.FormTTL, refused cross-site. Its nonce
//     is the action's key in the audit table (migrate.Tables.ConsoleAudit,
//     created by migrate.Up): a form submitted twice acts once, and the
//     second submission says so. The audit row (who, when, from which
//     address, what, the outcome) is written before the action runs; an
//     action whose row cannot be written does not run. Revealing a dead
//     letter's payload is audited too.
//   - Config.ReadOnly hides every action and refuses every POST.
//   - Pages render server-side without JavaScript; every page answers
//     ?format=json or Accept: application/json with the same data.
//     Responses carry a Content-Security-Policy without inline script,
//     X-Frame-Options: DENY, and Cache-Control: no-store (but the static
//     files).
//   - A dead-letter replay runs dlq.Reprocessor in Republish mode, or in
//     Redrive mode for the topics of Config.Redrive, once over the
//     selection (the filter, or up to ReplaySelectionMax message IDs). It
//     runs within the request: its page shows the summary when done.
//   - Seeking a consumer is not an action: the consumer's page prints the
//     idemkit consumer seek command, to be run with the consumers stopped.
//
// A dead-letter page reads its topic with dlq.List and a Window: it keeps
// the page's letters, without key, value or headers, and counts the
// others as it reads them; a letter's page reads that letter only.
package console
