//! A real OpenLDAP server (Debian's `slapd`) on free loopback ports, with a directory the tests
//! load: an OpenLDAP-shaped tree (`uid`, `groupOfNames`, nested groups) and an AD-shaped one
//! (`sAMAccountName`, `userPrincipalName`, `memberOf`, `userAccountControl`) in the same server.
//! LDAPS and StartTLS with a CA of the test's own. Like Active Directory, one search answers
//! at most 500 entries; a paged search (RFC 2696) all of them.

use std::{fmt::Write as _, path::Path, time::Duration};

use tokio::process::{Child, Command};

/// The directory's suffix.
pub const BASE: &str = "dc=example,dc=org";
/// The service account the hub binds as, and its password.
pub const READER_DN: &str = "cn=reader,dc=example,dc=org";
pub const READER_PASSWORD: &str = "reader-secret-0xC0FFEE";

/// AD's attributes and classes, with AD's own OIDs (slapd has no schema for them).
const AD_SCHEMA: &str = "\
dn: cn=ad,cn=schema,cn=config
objectClass: olcSchemaConfig
cn: ad
olcAttributeTypes: ( 1.2.840.113556.1.4.221 NAME 'sAMAccountName' EQUALITY caseIgnoreMatch SUBSTR caseIgnoreSubstringsMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )
olcAttributeTypes: ( 1.2.840.113556.1.4.656 NAME 'userPrincipalName' EQUALITY caseIgnoreMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )
olcAttributeTypes: ( 1.2.840.113556.1.4.8 NAME 'userAccountControl' EQUALITY integerMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.27 SINGLE-VALUE )
olcAttributeTypes: ( 1.2.840.113556.1.4.782 NAME 'objectCategory' EQUALITY caseIgnoreMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.15 SINGLE-VALUE )
olcAttributeTypes: ( 1.2.840.113556.1.2.102 NAME 'memberOf' EQUALITY distinguishedNameMatch SYNTAX 1.3.6.1.4.1.1466.115.121.1.12 )
olcObjectClasses: ( 1.2.840.113556.1.5.9 NAME 'user' SUP inetOrgPerson STRUCTURAL MAY ( sAMAccountName $ userPrincipalName $ userAccountControl $ objectCategory $ memberOf ) )
olcObjectClasses: ( 1.2.840.113556.1.5.8 NAME 'group' SUP groupOfNames STRUCTURAL MAY ( sAMAccountName $ memberOf ) )
";

/// A running slapd; killed when dropped.
#[derive(Debug)]
pub struct Slapd {
    _child: Child,
    /// `ldap://127.0.0.1:PORT` (StartTLS available).
    pub ldap_url: String,
    /// `ldaps://127.0.0.1:PORT`.
    pub ldaps_url: String,
    /// The CA that signed the server's certificate.
    pub ca_pem: String,
    admin_password: String,
}

impl Slapd {
    /// Configures and starts slapd in `dir`; returns once it accepts connections, with only
    /// the base entries and the service account loaded.
    pub async fn start(dir: &Path) -> Slapd {
        let ca = tunnel::tls::CertificateAuthority::generate("test directory CA").unwrap();
        let served = ca.issue_server(&["127.0.0.1".to_owned()]).unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let cert = write("server.pem", &served.cert_pem);
        let key = write("server.key", &served.key_pem);
        let ca_file = write("ca.pem", &ca.pem().cert_pem);
        let admin_password = "directory-admin-password".to_owned();
        let db = dir.join("db");
        let conf = dir.join("slapd.d");
        std::fs::create_dir_all(&db).unwrap();
        std::fs::create_dir_all(&conf).unwrap();
        let config = format!(
            "\
dn: cn=config
objectClass: olcGlobal
cn: config
olcTLSCertificateFile: {cert}
olcTLSCertificateKeyFile: {key}
olcTLSCACertificateFile: {ca_file}

dn: cn=module{{0}},cn=config
objectClass: olcModuleList
cn: module{{0}}
olcModulePath: /usr/lib/ldap
olcModuleLoad: back_mdb

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

include: file:///etc/ldap/schema/core.ldif
include: file:///etc/ldap/schema/cosine.ldif
include: file:///etc/ldap/schema/inetorgperson.ldif

{AD_SCHEMA}
dn: olcDatabase={{-1}}frontend,cn=config
objectClass: olcDatabaseConfig
objectClass: olcFrontendConfig
olcDatabase: {{-1}}frontend
olcSizeLimit: size.soft=500 size.hard=500 size.prtotal=unlimited

dn: olcDatabase={{0}}config,cn=config
objectClass: olcDatabaseConfig
olcDatabase: {{0}}config
olcAccess: {{0}}to * by * none

dn: olcDatabase={{1}}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {{1}}mdb
olcSuffix: {BASE}
olcRootDN: cn=admin,{BASE}
olcRootPW: {admin_password}
olcDbDirectory: {db}
olcDbMaxSize: 268435456
olcDbIndex: objectClass eq
olcDbIndex: member eq
olcDbIndex: uid eq
olcDbIndex: sAMAccountName eq
olcAccess: {{0}}to attrs=userPassword by anonymous auth by * none
olcAccess: {{1}}to * by dn.exact=\"{READER_DN}\" read by self read by * none
",
            db = db.display()
        );
        let config_file = write("config.ldif", &config);
        let conf_dir = conf.display().to_string();
        crate::sh(&format!("slapadd -n0 -F {conf_dir} -l {config_file}"));
        let (plain, tls) = (crate::free_port(), crate::free_port());
        let child = Command::new("slapd")
            .args(["-d", "0", "-F", &conf_dir, "-h"])
            .arg(format!(
                "ldap://127.0.0.1:{plain}/ ldaps://127.0.0.1:{tls}/"
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start slapd (Debian package slapd)");
        // Up when it accepts connections on both ports.
        tokio::time::timeout(Duration::from_secs(30), async {
            for port in [plain, tls] {
                while tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_err()
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
        .await
        .expect("slapd accepting connections within 30 s");
        let slapd = Slapd {
            _child: child,
            ldap_url: format!("ldap://127.0.0.1:{plain}"),
            ldaps_url: format!("ldaps://127.0.0.1:{tls}"),
            ca_pem: ca.pem().cert_pem.clone(),
            admin_password,
        };
        slapd.add(&format!(
            "\
dn: {BASE}
objectClass: dcObject
objectClass: organization
o: Example
dc: example

dn: {READER_DN}
objectClass: person
cn: reader
sn: reader
userPassword: {READER_PASSWORD}

dn: ou=people,{BASE}
objectClass: organizationalUnit
ou: people

dn: ou=groups,{BASE}
objectClass: organizationalUnit
ou: groups

dn: ou=corp,{BASE}
objectClass: organizationalUnit
ou: corp
"
        ));
        slapd
    }

    fn tool(&self, tool: &str, ldif: &str) {
        use std::io::Write as _;
        let mut child = std::process::Command::new(tool)
            .args([
                "-x",
                "-H",
                &self.ldap_url,
                "-D",
                &format!("cn=admin,{BASE}"),
            ])
            .args(["-w", &self.admin_password])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{tool} (Debian package ldap-utils): {e}"));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(ldif.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{tool}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ldapadd`s these entries.
    pub fn add(&self, ldif: &str) {
        self.tool("ldapadd", ldif);
    }

    /// `ldapmodify`s with this change record.
    pub fn modify(&self, ldif: &str) {
        self.tool("ldapmodify", ldif);
    }

    /// An OpenLDAP-shaped user `uid=<uid>,ou=people`.
    pub fn add_user(&self, uid: &str, display: &str, password: &str) {
        self.add(&format!(
            "dn: uid={uid},ou=people,{BASE}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {display}\nsn: {uid}\nuserPassword: {password}\n"
        ));
    }

    /// A `groupOfNames` `cn=<cn>,ou=groups` with these member DNs.
    pub fn add_group(&self, cn: &str, members: &[String]) {
        let mut ldif =
            format!("dn: cn={cn},ou=groups,{BASE}\nobjectClass: groupOfNames\ncn: {cn}\n");
        for member in members {
            writeln!(ldif, "member: {member}").unwrap();
        }
        self.add(&ldif);
    }

    /// Removes `member` from group `cn=<cn>,ou=groups`.
    pub fn remove_member(&self, cn: &str, member: &str) {
        self.modify(&format!(
            "dn: cn={cn},ou=groups,{BASE}\nchangetype: modify\ndelete: member\nmember: {member}\n"
        ));
    }
}

/// The DN of OpenLDAP-shaped user `uid`.
pub fn user_dn(uid: &str) -> String {
    format!("uid={uid},ou=people,{BASE}")
}
