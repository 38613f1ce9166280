//! Whose NF an instance runs ([`NfOwner`]): named in every host log line
//! about it.

/// Whose NF an instance runs: its tenant, deployment and version, named in
/// every host log line about it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NfOwner {
    /// Tenant id.
    pub tenant: String,
    /// Deployment id.
    pub deployment: String,
    /// Module version.
    pub version: String,
}

impl NfOwner {
    /// The fields of `owner` for a log line: tenant, deployment, version
    /// (absent without an owner).
    pub fn fields(owner: Option<&NfOwner>) -> (OwnerField<'_>, OwnerField<'_>, OwnerField<'_>) {
        let f = |pick: fn(&NfOwner) -> &str| owner.map(|o| tracing::field::display(pick(o)));
        (f(|o| &o.tenant), f(|o| &o.deployment), f(|o| &o.version))
    }
}

/// One field of an [`NfOwner`] in a log line.
pub type OwnerField<'a> = Option<tracing::field::DisplayValue<&'a str>>;
