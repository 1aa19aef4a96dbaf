-- The order service's own tables, created in the demo's schema right after
-- idemkit's migrations. A real service ships them as migrations of its own.

CREATE TABLE accounts (
    id      text   PRIMARY KEY,
    balance bigint NOT NULL DEFAULT 0 -- payments received for the customer's orders, in cents
);

CREATE TABLE orders (
    id         text   PRIMARY KEY,
    account_id text   NOT NULL REFERENCES accounts (id),
    amount     bigint NOT NULL CHECK (amount > 0), -- in cents
    status     text   NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid'))
);
