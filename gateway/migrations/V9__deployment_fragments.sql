-- What a deployment's NFs see of fragmented IP datagrams: 'follow' (the
-- first fragment; the later ones follow its verdict) or 'reassemble'
-- (whole datagrams, cut again on the way out).
ALTER TABLE deployments ADD COLUMN fragments TEXT NOT NULL DEFAULT 'follow';
