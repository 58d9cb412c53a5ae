//! Roles are a set, not a ladder (reference §10.4, producing.md): each role grants a fixed set
//! of capabilities, a token's grants are the union over its roles, and a route passes when its
//! requirement is inside that union. Owns [`Capability`] (what a route requires; the route table
//! in `http` names one per route). Knows nothing about tokens or HTTP.

use std::fmt;

use crate::settings::RoleNames;

/// What a caller must be allowed to do to use a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Anyone.
    Public,
    /// Push messages.
    Produce,
    /// Pop, ack, renew leases.
    Consume,
    /// Both at once (`POST /api/v1/transaction`: pushes and acks in one transaction).
    ProduceAndConsume,
    /// Create and change queues and groups.
    Configure,
    /// Read-only views.
    Read,
    /// Operator actions.
    Admin,
}

/// What a caller may do: a set of the five capabilities of §10.4.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Grants(u8);

impl Grants {
    /// Nothing (public routes require this).
    pub const NONE: Grants = Grants(0);
    /// `POST /api/v1/push`.
    pub const PRODUCE: Grants = Grants(1);
    /// Pop, ack, lease extend, trace writes.
    pub const CONSUME: Grants = Grants(1 << 1);
    /// Queue and consumer-group configuration, message deletes.
    pub const CONFIGURE: Grants = Grants(1 << 2);
    /// Every read-only view.
    pub const READ: Grants = Grants(1 << 3);
    /// Operator routes.
    pub const ADMIN: Grants = Grants(1 << 4);

    /// Both sets.
    pub const fn union(self, other: Grants) -> Grants {
        Grants(self.0 | other.0)
    }

    /// Whether every capability of `required` is in this set.
    pub const fn covers(self, required: Grants) -> bool {
        self.0 & required.0 == required.0
    }

    /// What a route with this capability requires.
    pub const fn required_for(capability: Capability) -> Grants {
        match capability {
            Capability::Public => Grants::NONE,
            Capability::Produce => Grants::PRODUCE,
            Capability::Consume => Grants::CONSUME,
            Capability::ProduceAndConsume => Grants::PRODUCE.union(Grants::CONSUME),
            Capability::Configure => Grants::CONFIGURE,
            Capability::Read => Grants::READ,
            Capability::Admin => Grants::ADMIN,
        }
    }
}

impl fmt::Debug for Grants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Grants::PRODUCE, "produce"),
            (Grants::CONSUME, "consume"),
            (Grants::CONFIGURE, "configure"),
            (Grants::READ, "read"),
            (Grants::ADMIN, "admin"),
        ];
        f.debug_set()
            .entries(
                names
                    .iter()
                    .filter(|(g, _)| self.covers(*g))
                    .map(|(_, n)| n),
            )
            .finish()
    }
}

/// A role a token can carry, by its meaning (the values come from `JWT_ROLE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `JWT_ROLE_ADMIN`: everything.
    Admin,
    /// `JWT_ROLE_READ_WRITE`: everything but the operator routes.
    ReadWrite,
    /// `JWT_ROLE_READ_ONLY`: the read views only.
    ReadOnly,
    /// `JWT_ROLE_WRITE_ONLY`: `POST /api/v1/push` only.
    WriteOnly,
}

impl Role {
    /// The §10.4 table, one row per role. Keeps every 0.15 permission of the three old roles.
    pub const fn grants(self) -> Grants {
        match self {
            Role::Admin => Grants::PRODUCE
                .union(Grants::CONSUME)
                .union(Grants::CONFIGURE)
                .union(Grants::READ)
                .union(Grants::ADMIN),
            Role::ReadWrite => Grants::PRODUCE
                .union(Grants::CONSUME)
                .union(Grants::CONFIGURE)
                .union(Grants::READ),
            Role::ReadOnly => Grants::READ,
            Role::WriteOnly => Grants::PRODUCE,
        }
    }

    /// The role a claim value names; unknown values name none and grant nothing.
    pub fn from_claim(value: &str, names: &RoleNames) -> Option<Role> {
        [
            (Role::Admin, &names.admin),
            (Role::ReadWrite, &names.read_write),
            (Role::ReadOnly, &names.read_only),
            (Role::WriteOnly, &names.write_only),
        ]
        .into_iter()
        .find(|(_, name)| name.as_str() == value)
        .map(|(role, _)| role)
    }
}

/// The roles of one token (the union of its role claims), without duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roles(Vec<Role>);

impl Roles {
    /// Adds the role a claim value names, if any.
    pub fn add_claim(&mut self, value: &str, names: &RoleNames) {
        if let Some(role) = Role::from_claim(value, names) {
            if !self.0.contains(&role) {
                self.0.push(role);
            }
        }
    }

    /// The roles, in the order first seen.
    pub fn as_slice(&self) -> &[Role] {
        &self.0
    }

    /// Everything any of the roles grants.
    pub fn grants(&self) -> Grants {
        self.0
            .iter()
            .fold(Grants::NONE, |acc, role| acc.union(role.grants()))
    }

    /// Whether these roles may use a route with `capability`.
    pub fn allow(&self, capability: Capability) -> bool {
        self.grants().covers(Grants::required_for(capability))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> RoleNames {
        RoleNames {
            admin: "admin".into(),
            read_write: "read-write".into(),
            read_only: "read-only".into(),
            write_only: "write-only".into(),
        }
    }

    fn roles(values: &[&str]) -> Roles {
        let mut roles = Roles::default();
        for v in values {
            roles.add_claim(v, &names());
        }
        roles
    }

    const ALL: [Capability; 7] = [
        Capability::Public,
        Capability::Produce,
        Capability::Consume,
        Capability::ProduceAndConsume,
        Capability::Configure,
        Capability::Read,
        Capability::Admin,
    ];

    /// The §10.4 table written out as allowed capabilities, independent of `Role::grants`.
    fn expected(role: &str) -> Vec<Capability> {
        use Capability::*;
        match role {
            "admin" => ALL.to_vec(),
            "read-write" => vec![Public, Produce, Consume, ProduceAndConsume, Configure, Read],
            "read-only" => vec![Public, Read],
            "write-only" => vec![Public, Produce],
            _ => vec![Public],
        }
    }

    #[test]
    fn each_role_grants_exactly_its_row_of_the_table() {
        for role in [
            "admin",
            "read-write",
            "read-only",
            "write-only",
            "nobody",
            "",
        ] {
            let allowed: Vec<Capability> = ALL
                .into_iter()
                .filter(|c| roles(&[role]).allow(*c))
                .collect();
            assert_eq!(allowed, expected(role), "role {role:?}");
        }
    }

    #[test]
    fn a_token_may_do_what_any_of_its_roles_grants() {
        let both = roles(&["read-only", "write-only"]);
        assert!(both.allow(Capability::Produce));
        assert!(both.allow(Capability::Read));
        assert!(!both.allow(Capability::Consume));
        assert!(!both.allow(Capability::ProduceAndConsume));
        assert_eq!(
            roles(&["write-only", "bogus", "write-only"]).as_slice(),
            [Role::WriteOnly]
        );
    }

    #[test]
    fn role_values_come_from_settings_and_are_exact() {
        let custom = RoleNames {
            write_only: "ingest".into(),
            ..names()
        };
        assert_eq!(Role::from_claim("ingest", &custom), Some(Role::WriteOnly));
        assert_eq!(Role::from_claim("write-only", &custom), None);
        assert_eq!(Role::from_claim("Admin", &names()), None);
    }

    #[test]
    fn grants_print_by_name() {
        assert_eq!(format!("{:?}", Role::WriteOnly.grants()), r#"{"produce"}"#);
    }
}
