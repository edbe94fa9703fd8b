// Passkeys for approvers (README § Signed approvals). Same-origin script, no inline code.
// - On /ui/passkeys: "Add a passkey" runs navigator.credentials.create() with the
//   server's options and posts the response back.
// - On a request page that asks for a signature (#signature): submitting a review form
//   first asks the server for the challenge (the digest of the review statement), has the
//   authenticator sign it (user verification required) and sends the assertion with the form.
(function () {
  "use strict";

  function toBytes(text) {
    var b64 = text.replace(/-/g, "+").replace(/_/g, "/");
    while (b64.length % 4) { b64 += "="; }
    var raw = atob(b64);
    var out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { out[i] = raw.charCodeAt(i); }
    return out.buffer;
  }

  function toText(buffer) {
    var bytes = new Uint8Array(buffer);
    var raw = "";
    for (var i = 0; i < bytes.length; i++) { raw += String.fromCharCode(bytes[i]); }
    return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function csrfToken() {
    var field = document.querySelector("input[name=csrf_token]");
    return field ? field.value : "";
  }

  function show(element, text) {
    if (!element) { return; }
    element.textContent = text;
    element.hidden = !text;
  }

  async function postJSON(url, body) {
    var response = await fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-CSRF-Token": csrfToken()},
      body: JSON.stringify(body)
    });
    var data = await response.json().catch(function () { return {}; });
    if (!response.ok) { throw new Error(data.detail || ("HTTP " + response.status)); }
    return data;
  }

  function descriptors(list) {
    return (list || []).map(function (c) {
      return {type: c.type, id: toBytes(c.id), transports: c.transports};
    });
  }

  async function register(status) {
    var options = await postJSON("/ui/passkeys/options", {});
    options.challenge = toBytes(options.challenge);
    options.user.id = toBytes(options.user.id);
    options.excludeCredentials = descriptors(options.excludeCredentials);
    var credential = await navigator.credentials.create({publicKey: options});
    var response = credential.response;
    var name = document.getElementById("passkey-name");
    await postJSON("/ui/passkeys", {
      name: name ? name.value : "",
      credential: {
        id: credential.id, rawId: toText(credential.rawId), type: credential.type,
        response: {
          clientDataJSON: toText(response.clientDataJSON),
          attestationObject: toText(response.attestationObject),
          transports: response.getTransports ? response.getTransports() : []
        },
        clientExtensionResults: credential.getClientExtensionResults(),
        authenticatorAttachment: credential.authenticatorAttachment
      }
    });
    show(status, "");
    window.location.reload();
  }

  // Exposed for the review page (and tests): sign `decision` on approval `approvalId`.
  async function signReview(approvalId, decision) {
    var options = await postJSON("/ui/approvals/" + encodeURIComponent(approvalId) +
                                 "/signature-options", {decision: decision});
    var publicKey = options.publicKey;
    publicKey.challenge = toBytes(publicKey.challenge);
    publicKey.allowCredentials = descriptors(publicKey.allowCredentials);
    var assertion = await navigator.credentials.get({publicKey: publicKey});
    var r = assertion.response;
    return {
      id: assertion.id, rawId: toText(assertion.rawId), type: assertion.type,
      response: {
        authenticatorData: toText(r.authenticatorData),
        clientDataJSON: toText(r.clientDataJSON),
        signature: toText(r.signature),
        userHandle: r.userHandle ? toText(r.userHandle) : null
      }
    };
  }

  function wireReviewForms(marker) {
    var status = document.getElementById("signature-status");
    var approvalId = marker.getAttribute("data-approval");
    var forms = document.querySelectorAll("form[action$='/review']");
    forms.forEach(function (form) {
      form.addEventListener("submit", async function (event) {
        if (form.dataset.signed === "1") { return; }
        event.preventDefault();
        var decision = form.querySelector("input[name=decision]").value;
        try {
          var assertion = await signReview(approvalId, decision);
          var field = form.querySelector("input[name=assertion]");
          if (!field) {
            field = document.createElement("input");
            field.type = "hidden";
            field.name = "assertion";
            form.appendChild(field);
          }
          field.value = JSON.stringify(assertion);
          form.dataset.signed = "1";
          form.submit();
        } catch (error) {
          show(status, "Your passkey did not sign this review: " + error.message);
        }
      });
    });
  }

  window.cosignerPasskeys = {signReview: signReview};

  document.addEventListener("DOMContentLoaded", function () {
    var add = document.getElementById("add-passkey");
    if (add) {
      var status = document.getElementById("passkey-status");
      add.addEventListener("click", function () {
        register(status).catch(function (error) {
          show(status, "The passkey was not added: " + error.message);
        });
      });
    }
    var marker = document.getElementById("signature");
    if (marker) { wireReviewForms(marker); }
  });
})();
