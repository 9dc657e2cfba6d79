//! The machine layer's objects through the API: a credential's secrets are write-only and kept
//! on update, templates cannot change and need a credential of their driver, a credential in
//! use cannot go, and only admins see credentials.

use super::*;

#[tokio::test]
async fn credentials_keep_their_secrets_and_templates_stay_as_made() {
    let t = setup().await;
    let admin = t.admin.clone();
    // A credential without its secret, or with a key that is not one, is refused with why.
    let (status, body) = t
        .call(
            Method::POST,
            "/v1/cloudcredentials",
            Some(&admin),
            Some(json!({"metadata": {"name": "lab"}, "spec": {"driver": "ssh", "ssh": {}}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("spec.ssh.privateKey"),
        "{body}"
    );
    let (status, body) = t
        .call(Method::POST, "/v1/cloudcredentials", Some(&admin),
            Some(json!({"metadata": {"name": "lab"}, "spec": {"driver": "ssh", "ssh": {"privateKey": "hunter2"}}})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("spec.ssh.privateKey"),
        "{body}"
    );
    let (status, body) = t
        .call(Method::POST, "/v1/cloudcredentials", Some(&admin),
            Some(json!({"metadata": {"name": "lab"}, "spec": {"driver": "amazonec2", "ssh": {"privateKey": TEST_KEY}}})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("spec.amazonec2"),
        "{body}"
    );

    let created = t
        .create(&admin, "cloudcredentials",
            json!({"metadata": {"name": "lab"}, "spec": {"driver": "ssh", "description": "lab machines", "ssh": {"privateKey": TEST_KEY}}}))
        .await;
    assert!(!created.to_string().contains("OPENSSH"), "{created}");
    // An update that leaves the key out keeps it; nothing ever shows it.
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/cloudcredentials/lab",
            Some(&admin),
            Some(json!({"spec": {"description": "the lab's machines"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.to_string().contains("OPENSSH"), "{body}");
    let stored = t.store.get("CloudCredential", "lab").await.unwrap();
    assert_eq!(stored.spec["ssh"]["privateKey"], TEST_KEY);
    let (_, listed) = t
        .call(Method::GET, "/v1/cloudcredentials", Some(&admin), None)
        .await;
    assert!(!listed.to_string().contains("OPENSSH"), "{listed}");

    // A registry's login: its password as write-only as a key.
    let created = t
        .create(&admin, "cloudcredentials",
            json!({"metadata": {"name": "mirror"}, "spec": {"driver": "registry", "registry": {"username": "puller", "password": "pull secret"}}}))
        .await;
    assert_eq!(created["spec"]["registry"], json!({"username": "puller"}));
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/cloudcredentials/mirror",
            Some(&admin),
            Some(json!({"spec": {"registry": {"username": "reader"}}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.to_string().contains("pull secret"), "{body}");
    let stored = t.store.get("CloudCredential", "mirror").await.unwrap();
    assert_eq!(
        stored.spec["registry"],
        json!({"username": "reader", "password": "pull secret"})
    );
    // A client certificate: its key as write-only; a certificate without its key is refused.
    let cert = "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n";
    let key = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";
    let created = t
        .create(&admin, "cloudcredentials",
            json!({"metadata": {"name": "mtls"}, "spec": {"driver": "registry", "registry": {"certificate": cert, "key": key}}}))
        .await;
    assert_eq!(created["spec"]["registry"], json!({"certificate": cert}));
    let (status, body) = t
        .call(Method::POST, "/v1/cloudcredentials", Some(&admin),
            Some(json!({"metadata": {"name": "half"}, "spec": {"driver": "registry", "registry": {"certificate": cert}}})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("spec.registry.key"),
        "{body}"
    );
    // It makes no machines.
    let (status, body) = t
        .call(Method::POST, "/v1/machinetemplates", Some(&admin),
            Some(json!({"metadata": {"name": "mirrored"}, "spec": {"driver": "registry", "credential": "mirror"}})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("spec.driver: registry credentials"),
        "{body}"
    );

    // Only admins see credentials; everyone signed in reads templates.
    let (status, _) = t
        .call(Method::POST, "/v1/users", Some(&admin),
            Some(json!({"metadata": {"name": "ann"}, "spec": {"password": "a long enough password"}})))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let ann = t.login("ann", "a long enough password").await;
    let (status, _) = t
        .call(Method::GET, "/v1/cloudcredentials/lab", Some(&ann), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A template needs an existing credential of its driver.
    let template = |credential: &str| {
        json!({"metadata": {"name": "lab-v1"}, "spec": {"driver": "ssh", "credential": credential,
               "ssh": {"addresses": ["10.0.0.1", "10.0.0.2"], "installFlags": ["--no-systemd"]}}})
    };
    let (status, body) = t
        .call(
            Method::POST,
            "/v1/machinetemplates",
            Some(&admin),
            Some(template("nothing")),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("spec.credential"),
        "{body}"
    );
    let (status, body) = t
        .call(
            Method::POST,
            "/v1/machinetemplates",
            Some(&admin),
            Some(
                json!({"metadata": {"name": "bad"}, "spec": {"driver": "ssh", "credential": "lab",
                "ssh": {"addresses": ["10.0.0.1", "10.0.0.1"]}}}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("listed twice"),
        "{body}"
    );
    t.create(&admin, "machinetemplates", template("lab")).await;
    let (status, read) = t
        .call(Method::GET, "/v1/machinetemplates/lab-v1", Some(&ann), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(read["spec"]["ssh"]["user"], "root", "the default user");
    assert_eq!(read["spec"]["ssh"]["port"], 22);
    // It cannot change; labels aside, a new template is the way.
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/machinetemplates/lab-v1",
            Some(&admin),
            Some(json!({"spec": {"ssh": {"addresses": ["10.0.0.3"]}}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("cannot change"),
        "{body}"
    );
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/machinetemplates/lab-v1",
            Some(&admin),
            Some(json!({"metadata": {"labels": {"tier": "lab"}}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = t
        .call(
            Method::POST,
            "/v1/machinetemplates",
            Some(&ann),
            Some(json!({"metadata": {"name": "mine"},
            "spec": {"driver": "ssh", "credential": "lab", "ssh": {"addresses": ["10.0.0.9"]}}})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // The credential cannot go while a template uses it.
    let (status, body) = t
        .call(
            Method::DELETE,
            "/v1/cloudcredentials/lab",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("lab-v1"),
        "{body}"
    );
    let (status, _) = t
        .call(
            Method::DELETE,
            "/v1/machinetemplates/lab-v1",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = t
        .call(
            Method::DELETE,
            "/v1/cloudcredentials/lab",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}
