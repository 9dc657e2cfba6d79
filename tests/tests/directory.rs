//! Signing in with a company directory, end to end against a real OpenLDAP server (Debian's
//! slapd, loaded by the test): LDAPS with the test's CA, StartTLS, nested groups, a user in
//! 1,000 groups (more than one search answers: paged results), an Active Directory-shaped
//! tree (sAMAccountName, UPN, memberOf, a disabled account), groups that reach the cluster
//! through kubectl and are taken away by the scheduled refresh, the test-connection action
//! naming the step that failed, and the local admin working while the directory is down.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use sim::cluster::SimConfig;
use tests::{
    HubProcess, api,
    browser::{Driver, check_and_save_as},
    imported::{Imported, issued_kubeconfig, kubectl, kubectl_ok, until_allowed},
    ldap::{BASE, READER_DN, READER_PASSWORD, Slapd, user_dn},
    leaked_secrets,
    signin::{bind_group, groups_become, refresh_every},
    temp_dir,
};

const ALICE_PASSWORD: &str = "alice's directory password";

fn provider(url: &str, ca: &str, extra: Value) -> Value {
    let mut ldap = json!({
        "url": url,
        "caCerts": ca,
        "bindDn": READER_DN,
        "bindPassword": READER_PASSWORD,
        "userSearchBase": format!("ou=people,{BASE}"),
        "groupSearchBase": format!("ou=groups,{BASE}"),
    });
    if let (Value::Object(ldap), Value::Object(extra)) = (&mut ldap, extra) {
        ldap.extend(extra);
    }
    ldap
}

/// Creates provider `name`; the hub's answer, accepted or not.
async fn create_provider(hub: &HubProcess, admin: &str, name: &str, spec: Value) -> (u16, Value) {
    api(
        hub.addr,
        "POST",
        "/v1/authproviders",
        Some(admin),
        Some(json!({"metadata": {"name": name}, "spec": spec})),
    )
    .await
}

/// Reads provider `name`, changes it with `edit`, and writes it back (as read: without the
/// bind password unless `edit` sets one).
async fn change_provider(hub: &HubProcess, admin: &str, name: &str, edit: impl FnOnce(&mut Value)) {
    let path = format!("/v1/authproviders/{name}");
    let (status, mut read) = api(hub.addr, "GET", &path, Some(admin), None).await;
    assert_eq!(status, 200, "{read}");
    edit(&mut read);
    let (status, answer) = api(hub.addr, "PUT", &path, Some(admin), Some(read)).await;
    assert_eq!(status, 200, "{answer}");
}

async fn sign_in(hub: &HubProcess, provider: &str, user: &str, password: &str) -> (u16, Value) {
    api(
        hub.addr,
        "POST",
        "/v1/login",
        None,
        Some(
            json!({"username": user, "password": password, "provider": provider, "session": false}),
        ),
    )
    .await
}

async fn test_connection(hub: &HubProcess, admin: &str, name: &str, body: Value) -> Value {
    let (status, answer) = api(
        hub.addr,
        "POST",
        &format!("/v1/authproviders/{name}/test"),
        Some(admin),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_group_reaches_the_cluster_and_leaving_it_takes_the_right_away() {
    let imported = Imported::start(
        "directory",
        SimConfig {
            nodes: 1,
            pods: 4,
            ..SimConfig::default()
        },
    )
    .await;
    let (hub, admin, dir) = (&imported.hub, imported.admin.clone(), imported.dir.clone());
    let config =
        cluster_agent::Config::from_env(&imported.agent_env("drover-cluster-agent-0").await)
            .unwrap();
    tokio::spawn(cluster_agent::run(config, imported.shutdown.child_token()));
    let slapd_dir = dir.join("slapd");
    std::fs::create_dir_all(&slapd_dir).unwrap();
    let slapd = Slapd::start(&slapd_dir).await;
    slapd.add_user("alice", "Alice Liddell", ALICE_PASSWORD);
    slapd.add_group("ops", &[user_dn("alice"), user_dn("oscar")]);

    // Groups are read again every 10 s; the provider, over LDAPS with the test's CA.
    refresh_every(hub.addr, &admin, "10s").await;
    let spec = json!({"type": "ldap", "displayName": "Example Corp",
        "ldap": provider(&slapd.ldaps_url, &slapd.ca_pem, json!({}))});
    let (status, answer) = create_provider(hub, &admin, "corp", spec).await;
    assert_eq!(status, 201, "{answer}");
    // Role bindings name the directory's group, prefixed with the provider.
    bind_group(
        hub.addr,
        &admin,
        "ops-members",
        ("corp:ops", "cluster-member", Some("prod")),
    )
    .await;

    // Alice signs in with the directory: a hub User linked to her DN, with her groups.
    let (status, answer) = sign_in(hub, "corp", "alice", ALICE_PASSWORD).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["user"], "corp-alice");
    let alice = answer["token"].as_str().unwrap().to_owned();
    let (_, user) = api(hub.addr, "GET", "/v1/users/corp-alice", Some(&admin), None).await;
    assert_eq!(user["spec"]["principal"]["id"], user_dn("alice"), "{user}");
    assert_eq!(
        user["spec"]["providerGroups"],
        json!(["corp:ops"]),
        "{user}"
    );
    assert_eq!(user["spec"]["displayName"], "Alice Liddell");
    // A second login is the same user, not a new one.
    let (status, again) = sign_in(hub, "corp", "alice", ALICE_PASSWORD).await;
    assert_eq!((status, again["user"].clone()), (200, json!("corp-alice")));

    // Her kubeconfig works with kubectl; the cluster sees her directory group.
    let kubeconfig = issued_kubeconfig(hub, &alice, &dir, "alice", None).await;
    until_allowed(&kubeconfig, &["create", "configmaps", "-n", "load-0"]).await;
    kubectl_ok(
        &kubeconfig,
        &[
            "create",
            "configmap",
            "from-ldap",
            "-n",
            "load-0",
            "--from-literal=k=v",
        ],
    )
    .await;
    let seen = imported
        .sim
        .audit()
        .into_iter()
        .rev()
        .find(|e| e.method == "POST" && e.path.ends_with("/namespaces/load-0/configmaps"))
        .unwrap();
    assert_eq!(seen.user, "corp-alice");
    assert!(
        seen.groups.iter().any(|g| g == "corp:ops"),
        "{:?}",
        seen.groups
    );
    let binding = kubectl_ok(
        &imported.sim_admin,
        &[
            "get",
            "rolebinding",
            "drover-cluster-member",
            "-n",
            "load-0",
            "-o",
            "json",
        ],
    )
    .await;
    let binding: Value = serde_json::from_str(&binding).unwrap();
    assert!(
        binding["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["kind"] == "Group" && s["name"] == "corp:ops"),
        "{binding}"
    );

    // A group whose name is not ASCII reaches the cluster as the directory spells it: the
    // hub impersonates it as UTF-8, as kube-apiserver reads it, and the cluster's RBAC (as
    // the cluster-agent wrote it) lets its member read.
    let munich = "Entwickler München";
    slapd.add_user("bruno", "Bruno Weiß", "bruno's directory password");
    slapd.add_group(munich, &[user_dn("bruno")]);
    bind_group(
        hub.addr,
        &admin,
        "munich-readers",
        (&format!("corp:{munich}"), "read-only", Some("prod")),
    )
    .await;
    let (status, answer) = sign_in(hub, "corp", "bruno", "bruno's directory password").await;
    assert_eq!(status, 200, "{answer}");
    let bruno = answer["token"].as_str().unwrap().to_owned();
    let bruno_config = issued_kubeconfig(hub, &bruno, &dir, "bruno", None).await;
    until_allowed(&bruno_config, &["list", "pods", "-n", "load-0"]).await;
    kubectl_ok(&bruno_config, &["get", "pods", "-n", "load-0"]).await;
    let seen = imported
        .sim
        .audit()
        .into_iter()
        .rev()
        .find(|e| e.user == "corp-bruno" && e.path.ends_with("/namespaces/load-0/pods"))
        .unwrap();
    assert!(
        seen.groups.iter().any(|g| *g == format!("corp:{munich}")),
        "{:?}",
        seen.groups
    );

    // Taken out of ops in the directory: the next refresh takes the right away, on the hub
    // and through the proxy, without her signing in again.
    groups_become(hub.addr, &admin, "corp-alice", json!([]), async {
        slapd.remove_member("ops", &user_dn("alice"));
    })
    .await;
    let (status, me) = api(hub.addr, "GET", "/v1/me", Some(&alice), None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["clusters"], json!({}), "{me}");
    let (ok, _, stderr) = kubectl(&kubeconfig, &["get", "configmaps", "-n", "load-0"]).await;
    assert!(!ok, "still allowed after leaving ops");
    assert!(
        stderr.contains("Forbidden") || stderr.contains("forbidden"),
        "{stderr}"
    );

    // Gone from the directory: the refresh revokes her tokens.
    tests::revoked_by(hub.addr, &admin, &alice, async {
        slapd.modify(&format!("dn: {}\nchangetype: delete\n", user_dn("alice")));
    })
    .await;
    let (status, _) = sign_in(hub, "corp", "alice", ALICE_PASSWORD).await;
    assert_eq!(status, 401);

    // The bind password is never shown, and neither it nor a user's password is logged.
    let (_, shown) = api(
        hub.addr,
        "GET",
        "/v1/authproviders/corp",
        Some(&admin),
        None,
    )
    .await;
    assert!(
        shown["spec"]["ldap"].get("bindPassword").is_none(),
        "{shown}"
    );
    assert_eq!(shown["spec"]["ldap"]["bindDn"], READER_DN);
    let (_, audit) = api(
        hub.addr,
        "GET",
        "/v1/audit?limit=100000",
        Some(&admin),
        None,
    )
    .await;
    let log = hub.log.lock().unwrap().join("\n");
    for text in [audit.to_string(), log] {
        assert_eq!(
            leaked_secrets(&text, &[READER_PASSWORD, ALICE_PASSWORD, &alice]),
            Vec::<String>::new()
        );
    }
    let (_, audit) = api(
        hub.addr,
        "GET",
        "/v1/audit?user=corp-alice",
        Some(&admin),
        None,
    )
    .await;
    let login = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["verb"] == "login" && r["code"] == 200)
        .unwrap_or_else(|| panic!("{audit}"));
    assert_eq!(login["provider"], "corp");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_are_checked_step_by_step_and_sign_in_their_users_as_configured() {
    let dir = temp_dir("directories");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = tests::login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let slapd_dir = dir.join("slapd");
    std::fs::create_dir_all(&slapd_dir).unwrap();
    let slapd = Slapd::start(&slapd_dir).await;
    slapd.add_user("alice", "Alice Liddell", ALICE_PASSWORD);
    slapd.add_user("carol", "Carol", "carol's directory password");
    slapd.add_user("many", "In Many Groups", "many's directory password");
    // alice is in dev, dev is in eng, eng is in all-staff: three groups by nesting.
    slapd.add_group("dev", &[user_dn("alice")]);
    slapd.add_group("eng", &[format!("cn=dev,ou=groups,{BASE}")]);
    slapd.add_group("all-staff", &[format!("cn=eng,ou=groups,{BASE}")]);
    // 1,000 groups: twice what slapd answers to one search (its size limit is 500).
    let mut thousand = String::new();
    for n in 0..1000 {
        thousand.push_str(&format!(
            "dn: cn=g{n:04},ou=groups,{BASE}\nobjectClass: groupOfNames\ncn: g{n:04}\nmember: {}\n\n",
            user_dn("many")
        ));
    }
    slapd.add(&thousand);
    // Active Directory's shape: sAMAccountName, UPN, memberOf both ways, a disabled account.
    slapd.add(&format!(
        "\
dn: cn=Bob Builder,ou=corp,{BASE}
objectClass: user
cn: Bob Builder
sn: Builder
displayName: Bob the Builder
sAMAccountName: bob
userPrincipalName: bob@corp.example
userAccountControl: 512
objectCategory: person
userPassword: bob's domain password
memberOf: cn=Dev,ou=corp,{BASE}

dn: cn=Dave Gone,ou=corp,{BASE}
objectClass: user
cn: Dave Gone
sn: Gone
sAMAccountName: dave
userAccountControl: 514
objectCategory: person
userPassword: dave's domain password

dn: cn=Dev,ou=corp,{BASE}
objectClass: group
cn: Dev
member: cn=Bob Builder,ou=corp,{BASE}
memberOf: cn=Engineering,ou=corp,{BASE}

dn: cn=Engineering,ou=corp,{BASE}
objectClass: group
cn: Engineering
member: cn=Dev,ou=corp,{BASE}
"
    ));

    // Plain LDAP is refused unless asked for; the field to fix is named.
    let insecure = json!({"type": "ldap", "ldap": provider(&slapd.ldap_url, "", json!({}))});
    let (status, answer) = create_provider(&hub, &admin, "plain", insecure).await;
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("allowInsecure"),
        "{answer}"
    );
    let (status, answer) = create_provider(
        &hub,
        &admin,
        "local",
        json!({"type": "ldap",
        "ldap": provider(&slapd.ldaps_url, &slapd.ca_pem, json!({}))}),
    )
    .await;
    assert_eq!(status, 422, "{answer}");

    // StartTLS on the plain port, with the CA: works; the test action walks each step.
    let spec = json!({"type": "ldap", "ldap": provider(&slapd.ldap_url, &slapd.ca_pem, json!({"startTls": true}))});
    let (status, answer) = create_provider(&hub, &admin, "corp", spec).await;
    assert_eq!(status, 201, "{answer}");
    assert!(
        answer["spec"]["ldap"].get("bindPassword").is_none(),
        "{answer}"
    );
    let found = test_connection(&hub, &admin, "corp", json!({"username": "alice"})).await;
    assert_eq!(found["ok"], true, "{found}");
    assert_eq!(
        found["groups"],
        json!(["corp:all-staff", "corp:dev", "corp:eng"]),
        "{found}"
    );
    let none = test_connection(&hub, &admin, "corp", json!({"username": "nobody"})).await;
    assert_eq!(
        (none["ok"].clone(), none["step"].clone()),
        (json!(false), json!("user")),
        "{none}"
    );
    let lonely = test_connection(&hub, &admin, "corp", json!({"username": "carol"})).await;
    assert_eq!(
        (lonely["ok"].clone(), lonely["step"].clone()),
        (json!(false), json!("groups")),
        "{lonely}"
    );
    let many = test_connection(&hub, &admin, "corp", json!({"username": "many"})).await;
    assert_eq!(
        many["groups"].as_array().map(Vec::len),
        Some(1000),
        "{}",
        many["message"]
    );

    // A wrong bind password (an update that sets it) and an unreachable server say so.
    change_provider(&hub, &admin, "corp", |p| {
        p["spec"]["ldap"]["bindPassword"] = "not the reader's password".into();
    })
    .await;
    let refused = test_connection(&hub, &admin, "corp", json!({})).await;
    assert_eq!(refused["step"], "bind", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("bind refused"),
        "{refused}"
    );
    let (status, _) = sign_in(&hub, "corp", "alice", ALICE_PASSWORD).await;
    assert_eq!(status, 503);
    change_provider(&hub, &admin, "corp", |p| {
        p["spec"]["ldap"]["bindPassword"] = READER_PASSWORD.into();
    })
    .await;
    // An update that leaves the password out keeps it.
    change_provider(&hub, &admin, "corp", |p| {
        p["spec"]["displayName"] = "Example Corp".into();
    })
    .await;
    assert_eq!(
        test_connection(&hub, &admin, "corp", json!({})).await["ok"],
        true
    );
    let (status, answer) = create_provider(
        &hub,
        &admin,
        "nowhere",
        json!({"type": "ldap",
        "ldap": provider("ldaps://127.0.0.1:1", &slapd.ca_pem, json!({"timeoutSeconds": 2}))}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let unreachable = test_connection(&hub, &admin, "nowhere", json!({})).await;
    assert_eq!(unreachable["step"], "connect", "{unreachable}");

    // Wrong and empty passwords are refused (an empty one would be an anonymous bind).
    for password in ["not alice's password", ""] {
        let (status, _) = sign_in(&hub, "corp", "alice", password).await;
        assert_eq!(status, 401, "{password:?}");
    }
    let (status, answer) = sign_in(&hub, "corp", "alice", ALICE_PASSWORD).await;
    assert_eq!(status, 200, "{answer}");

    // Only members of eng may sign in: carol may not; alice (in eng through dev) may.
    change_provider(&hub, &admin, "corp", |p| {
        p["spec"]["allowed"] = json!({"groups": ["eng"]});
    })
    .await;
    let (status, answer) = sign_in(&hub, "corp", "carol", "carol's directory password").await;
    assert_eq!(status, 403, "{answer}");
    let (status, _) = sign_in(&hub, "corp", "alice", ALICE_PASSWORD).await;
    assert_eq!(status, 200);

    // The CLI signs in with the directory too, and acts as the linked user.
    let config = dir.join("cli.json");
    let url = hub.url();
    let cli = |args: &[&str], stdin: &str| tests::hub_cli(&config, args, stdin);
    let signed = cli(
        &[
            "login",
            "--server",
            &url,
            "--ca-checksum",
            &hub.ca_checksum,
            "--provider",
            "corp",
            "--username",
            "alice",
            "--password-stdin",
        ],
        &format!("{ALICE_PASSWORD}\n"),
    );
    assert_eq!(signed.code, 0, "{}", signed.stderr);
    assert!(
        signed.stdout.contains("as corp-alice (alice of corp)"),
        "{}",
        signed.stdout
    );
    let refused = cli(
        &[
            "login",
            "--server",
            &url,
            "--provider",
            "corp",
            "--username",
            "alice",
            "--password-stdin",
        ],
        "not alice's password\n",
    );
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("wrong username or password"),
        "{}",
        refused.stderr
    );

    // Active Directory: by sAMAccountName, UPN or DOMAIN\name; groups through memberOf's
    // chain; a disabled account is refused.
    let ad = json!({"type": "activedirectory", "displayName": "Corp AD", "ldap": provider(&slapd.ldaps_url, &slapd.ca_pem,
        json!({"userSearchBase": format!("ou=corp,{BASE}"), "groupSearchBase": format!("ou=corp,{BASE}")}))});
    let (status, answer) = create_provider(&hub, &admin, "ad", ad).await;
    assert_eq!(status, 201, "{answer}");
    for login in ["bob", "bob@corp.example", "CORP\\bob"] {
        let (status, answer) = sign_in(&hub, "ad", login, "bob's domain password").await;
        assert_eq!(
            (status, answer["user"].clone()),
            (200, json!("ad-bob")),
            "{login}: {answer}"
        );
    }
    let (_, bob) = api(hub.addr, "GET", "/v1/users/ad-bob", Some(&admin), None).await;
    assert_eq!(
        bob["spec"]["providerGroups"],
        json!(["ad:Dev", "ad:Engineering"]),
        "{bob}"
    );
    assert_eq!(bob["spec"]["displayName"], "Bob the Builder");
    let (status, _) = sign_in(&hub, "ad", "dave", "dave's domain password").await;
    assert_eq!(status, 401);
    let disabled = test_connection(&hub, &admin, "ad", json!({"username": "dave"})).await;
    assert!(
        disabled["message"].as_str().unwrap().contains("disabled"),
        "{disabled}"
    );

    // Failed sign-ins count against the account, however its name is spelled: five wrong
    // passwords under five spellings (the UPN resolves to the same entry) block it, even with
    // the right password. Others from the same address still sign in.
    for spelling in ["BOB", " bob", "bOb", "CORP\\bob", "bob@corp.example"] {
        let (status, answer) = sign_in(&hub, "ad", spelling, "a guess").await;
        assert_eq!(status, 401, "{spelling:?}: {answer}");
    }
    let (status, answer) = sign_in(&hub, "ad", "bob", "bob's domain password").await;
    assert_eq!(status, 429, "{answer}");
    let (status, answer) = sign_in(&hub, "corp", "alice", ALICE_PASSWORD).await;
    assert_eq!(status, 200, "{answer}");

    // The login page's list: the hub's own users and each enabled provider.
    let (status, offered) = api(hub.addr, "GET", "/v1/login/providers", None, None).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = offered["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["local", "ad", "corp", "nowhere"], "{offered}");
    // Only admins see or test providers: to anyone else they do not exist.
    let (status, _) = api(hub.addr, "POST", "/v1/users", Some(&admin),
        Some(json!({"metadata": {"name": "pat"}, "spec": {"password": "pat's long enough password"}}))).await;
    assert_eq!(status, 201);
    let pat = tests::login(hub.addr, "pat", "pat's long enough password").await;
    let (status, _) = api(hub.addr, "GET", "/v1/authproviders/corp", Some(&pat), None).await;
    assert_eq!(status, 404);
    // Listing them is refused outright (as Kubernetes refuses a list), naming no provider.
    let (status, listed) = api(hub.addr, "GET", "/v1/authproviders", Some(&pat), None).await;
    assert_eq!(status, 403, "{listed}");
    assert!(
        !listed.to_string().contains("corp") && !listed.to_string().contains("nowhere"),
        "{listed}"
    );
    let (status, _) = api(
        hub.addr,
        "POST",
        "/v1/authproviders/corp/test",
        Some(&pat),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 404);

    // The dashboard's login page offers each provider; alice signs in with hers.
    let driver = Driver::start(&dir).await;
    let browser = driver.browser("alice", 1280, 900).await;
    browser.goto(&format!("{}/login", hub.url())).await;
    let options = browser
        .run(
            "return [...document.querySelectorAll('#provider option')].map(o => o.textContent);",
            json!([]),
        )
        .await;
    assert_eq!(
        options,
        json!(["Local users", "Corp AD", "Example Corp", "nowhere"])
    );
    check_and_save_as(&browser, "directory-login").await;
    browser
        .run(
            "document.getElementById('provider').value = 'corp';",
            json!([]),
        )
        .await;
    browser.type_into("#username", "alice").await;
    browser.type_into("#password", ALICE_PASSWORD).await;
    browser.click("form#login button[type=submit]").await;
    browser.find("table#clusters").await;
    browser.close().await;

    // The directory down: its users cannot sign in, the hub's own admin still can.
    drop(slapd);
    let (status, answer) = sign_in(&hub, "corp", "alice", ALICE_PASSWORD).await;
    assert_eq!(status, 503, "{answer}");
    tests::login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let log = hub.log.lock().unwrap().join("\n");
    assert_eq!(
        leaked_secrets(&log, &[READER_PASSWORD, ALICE_PASSWORD]),
        Vec::<String>::new()
    );
}
