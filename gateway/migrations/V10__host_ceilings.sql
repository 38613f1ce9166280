-- What a host can process at most, set by the operator at registration:
-- packets and bits per second. A meter record claiming more in its window
-- is refused. NULL: the gateway's defaults (host-max-pps, host-max-bps).
ALTER TABLE hosts ADD COLUMN max_pps INTEGER;
ALTER TABLE hosts ADD COLUMN max_bps INTEGER;
