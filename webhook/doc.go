// Package webhook receives webhook deliveries exactly once: each is
// verified (Standard Webhooks, GitHub, Stripe or Shopify signatures), its
// provider's event ID is reserved, and the handler runs in the PostgreSQL
// transaction that records the event, with its outbox messages; a duplicate
// delivery gets the stored answer at once.
//
// Providers deliver at least once: they send an event again after a
// timeout, an error or a lost answer, for hours or days. A Receiver turns
// that into one effect per event, on the idempotency middleware of package
// idemhttp (its records, transaction, fingerprints, 409 and 422, and its
// Redis backend), with the provider's event ID in place of an
// Idempotency-Key:
//
//	stripe, err := webhook.Stripe(os.Getenv("STRIPE_WEBHOOK_SECRET"))
//	receiver, err := webhook.New(pool, &webhook.Config{Provider: "stripe", Verify: stripe,
//		HTTP: idemhttp.Config{FingerprintKeys: keys}})
//	mux.Handle("POST /webhooks/stripe", receiver.Handler(webhook.HandlerFunc(apply)))
//
// The guide docs/webhooks.md walks through a service receiving Stripe and
// GitHub deliveries (examples/webhooks).
// ExampleNew shows a Stripe endpoint: each event's effect commits with its
// record, a retry of the event gets the stored answer, a delivery signed
// with another secret gets 401.
//
// # Contract
//
// Order. A delivery's body is read whole, up to
// idemhttp.Config.MaxRequestBytes (a longer one gets 413 and leaves no
// record), and verified before anything else: a missing, malformed or
// wrong signature, or one made with no secret of the list, gets 401
// signature_invalid; an authentic delivery signed further from now than
// Scheme.Tolerance (Standard Webhooks and Stripe sign a timestamp: 5
// minutes either way by default) gets 401 timestamp_invalid. Neither
// leaves a record, calls the handler or echoes the body; the log line
// (WARN) says why, without secrets. Signatures are compared in constant
// time, against every secret of the Scheme, so that an endpoint keeps
// receiving while its secret rotates.
//
// Scope. The event ID is taken where the provider puts it (Webhook-Id,
// X-GitHub-Delivery, X-Shopify-Webhook-Id, the "id" member of Stripe's
// JSON body; idemhttp.Config.Key for others) and reserved under the
// account "webhook:" + Config.Provider and the route's operation, so two
// providers' IDs never meet. A delivery without one gets 400
// idempotency_key_missing, an ID that is not a string 400
// idempotency_key_invalid.
//
// Once. The first delivery of an event runs the handler in the
// middleware's transaction; its writes, its outbox messages and the
// record of the event with its answer (200 {"status":"processed"}) commit
// together, then the answer is sent. A duplicate delivery afterwards gets
// that answer, marked Idempotent-Replayed: true, at once, and the provider
// stops; one that arrives while the first is running gets 409 (the
// provider sends it again later; idemhttp.Config.Wait makes it wait for the
// answer instead). A delivery with the ID of an event received before but
// another body (its fingerprint: by default the canonical JSON of the
// body; Stripe's leaves out pending_webhooks) gets 422 and runs nothing,
// logged at ERROR: the provider, or someone holding its secret, sent two
// things under one name. A handler error answers 500 and rolls everything
// back: the provider sends the delivery again. With
// Config.AcknowledgePermanent, an error marked retry.Permanent is stored as
// the event's answer instead (200 with the error), its writes undone: see
// docs/webhooks.md for that trade-off.
//
// Window. The record of an event lives idemhttp.Config.TTL (TTLDefault, 7
// days, for a receiver): a delivery of the event after that runs the
// handler again. Keep it longer than the provider's retry horizon (Stripe
// retries for 3 days, the Standard Webhooks schedule a little longer,
// GitHub redelivers on request for 3 days, Shopify retries for 4 hours).
//
// What the signatures do not cover. GitHub and Shopify sign the body only,
// with no timestamp, and their delivery IDs are headers outside the
// signature: whoever captures a delivery can send it again, any time, under
// another ID, and it is then applied again. Deduplication stops replays
// under the same ID within the TTL; for these providers, also make the
// effect idempotent on something in the body (the pushed commit, the order
// ID) where a second application matters. Stripe's ID is in the signed body
// and Standard Webhooks signs its ID and timestamp, so a replay is refused
// by its timestamp and the tolerance, or by its ID.
//
// Observability. Config.Observe gets one Event per delivery (provider,
// event ID, Outcome, status, duration); the module
// github.com/idemkit/idemkit/idemotel counts them per provider and outcome
// (idemkit_webhook_deliveries_total). Logs carry the provider and the
// event ID: refused deliveries at WARN, reused IDs and handler failures at
// ERROR, duplicates at INFO.
package webhook
