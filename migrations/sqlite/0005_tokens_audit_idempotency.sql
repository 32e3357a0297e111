-- Access control and request bookkeeping.

-- API tokens. Only a SHA-256 of each token is kept: a copy of the database
-- gives no working credential. The token itself is shown once, at creation.
create table tokens (
    -- Human-readable, unique: what audit records name.
    name          text primary key not null,
    role          text not null check (role in ('viewer', 'operator', 'admin')),
    -- Hex SHA-256 of the whole token string.
    hash          text not null unique,
    created_at    text not null,
    last_used_at  text
) strict;

-- Every mutating request, allowed or not.
create table audit (
    id          integer primary key autoincrement,
    time        text not null,
    -- Null when the request carried no valid token.
    token_name  text,
    role        text,
    method      text not null,
    path        text not null,
    -- The resource the route names, e.g. `pool/workers`, when there is one.
    resource    text,
    status      integer not null,
    outcome     text not null check (outcome in ('allowed', 'unauthenticated', 'forbidden'))
) strict;

create index audit_by_time on audit (id desc);

-- Responses of POST requests sent with an Idempotency-Key, replayed when
-- the same key comes again within 24 hours.
create table idempotency (
    -- Keys are scoped to the token that used them.
    token_name   text not null,
    key          text not null,
    method       text not null,
    path         text not null,
    -- Hex SHA-256 of the request body: the same key with another body is refused.
    body_hash    text not null,
    -- Null while the first request is still being served.
    status       integer,
    content_type text,
    location     text,
    etag         text,
    body         blob,
    created_at   text not null,
    primary key (token_name, key)
) strict;
