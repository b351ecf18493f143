// Console chat over /ws/chat/ (protocol: docs/architecture.md, "Web console").
// Replies stream in as delta frames; a dropped socket reconnects and resumes
// the in-flight reply after the last sequence number shown, so no text is
// lost or repeated.
(function () {
  "use strict";
  const root = document.getElementById("chat");
  if (!root) return;
  const transcript = document.getElementById("transcript");
  const form = document.getElementById("composer");
  const prompt = document.getElementById("prompt");
  const modelSelect = document.getElementById("model");
  const sendButton = document.getElementById("send");
  const stopButton = document.getElementById("stop");
  const regenerateButton = document.getElementById("regenerate");
  const errorBox = document.getElementById("chat-error");
  const socketStatus = document.getElementById("socket-status");

  const state = {
    conversationId: root.dataset.conversationId ? Number(root.dataset.conversationId) : null,
    socket: null,
    retries: 0,
    // The reply being streamed: {responseId, lastSeq, el, pendingText}.
    live: null,
    // A request sent but not yet started or refused: {el, userEl, content, frame}.
    pending: null,
    retryTimer: null,
    warmingTimer: null,
  };
  // For tests and debugging: every frame received, in order.
  window.consoleChat = { frames: [], state };

  function scrollDown() {
    transcript.scrollTop = transcript.scrollHeight;
  }

  function bubble(role, text, status) {
    const hint = document.getElementById("empty-hint");
    if (hint) hint.remove();
    const el = document.createElement("article");
    el.className = "msg " + role;
    el.dataset.role = role;
    el.dataset.status = status || "completed";
    const body = document.createElement("div");
    body.className = "body";
    body.textContent = text;
    el.appendChild(body);
    if (role === "assistant") {
      const meta = document.createElement("footer");
      meta.className = "meta";
      el.appendChild(meta);
    }
    transcript.appendChild(el);
    scrollDown();
    return el;
  }

  function setMeta(el, text, kind) {
    const meta = el.querySelector(".meta");
    if (!meta) return;
    meta.innerHTML = "";
    const badge = document.createElement("span");
    badge.className = "badge" + (kind ? " " + kind : "");
    badge.textContent = text;
    meta.appendChild(badge);
  }

  function busy(isBusy) {
    sendButton.disabled = isBusy;
    stopButton.hidden = !isBusy || !(state.live && state.live.responseId);
    regenerateButton.hidden = isBusy || state.conversationId === null;
  }

  function showError(message, retryAfter) {
    clearInterval(state.retryTimer);
    errorBox.hidden = false;
    if (retryAfter === null || retryAfter === undefined) {
      errorBox.textContent = message;
      return;
    }
    const until = Date.now() + retryAfter * 1000;
    const render = () => {
      const left = Math.max(0, Math.ceil((until - Date.now()) / 1000));
      errorBox.textContent = message + " " + (left > 0 ? retryText(left) : "You can retry now.");
      if (left <= 0) clearInterval(state.retryTimer);
    };
    render();
    state.retryTimer = setInterval(render, 1000);
  }

  function retryText(seconds) {
    if (seconds < 120) return "Retry in " + seconds + " s.";
    if (seconds < 7200) return "Retry in " + Math.ceil(seconds / 60) + " min.";
    const at = new Date(Date.now() + seconds * 1000);
    return "Retry after " + at.toLocaleString() + ".";
  }

  function clearError() {
    clearInterval(state.retryTimer);
    errorBox.hidden = true;
    errorBox.textContent = "";
  }

  function send(frame) {
    if (!state.socket || state.socket.readyState !== WebSocket.OPEN) {
      showError("Not connected to the server; reconnecting…");
      return false;
    }
    state.socket.send(JSON.stringify(frame));
    return true;
  }

  function rememberConversation(id) {
    if (state.conversationId === id) return;
    state.conversationId = id;
    root.dataset.conversationId = String(id);
    const url = root.dataset.conversationUrl + id + "/";
    history.replaceState(null, "", url);
    const list = document.getElementById("conversation-list");
    const none = document.getElementById("no-conversations");
    if (none) none.remove();
    if (!list.querySelector('[data-conversation-id="' + id + '"]')) {
      const li = document.createElement("li");
      const a = document.createElement("a");
      a.href = url;
      a.dataset.conversationId = String(id);
      a.setAttribute("aria-current", "page");
      const text = (state.pending ? state.pending.content : "Conversation " + id).replace(/\s+/g, " ");
      const title = text.length > 60 ? text.slice(0, 59) + "…" : text;
      a.textContent = title;
      li.appendChild(a);
      list.prepend(li);
      const heading = root.querySelector(".chat-head h1");
      if (heading) heading.textContent = title;
      document.title = title + " · LLM platform";
    }
  }

  function onFrame(frame) {
    window.consoleChat.frames.push(frame);
    switch (frame.type) {
      case "response.started": {
        rememberConversation(frame.conversation_id);
        const el = state.pending ? state.pending.el : bubble("assistant", "", "in_progress");
        el.dataset.responseId = frame.response_id;
        el.dataset.status = "in_progress";
        state.pending = null;
        state.live = { responseId: frame.response_id, lastSeq: 0, el };
        busy(true);
        break;
      }
      case "delta": {
        const live = state.live;
        // A resume replays only seq > lastSeq, but a frame from a socket
        // being replaced could still arrive: never show a seq twice.
        if (!live || live.responseId !== frame.response_id || frame.seq <= live.lastSeq) return;
        live.lastSeq = frame.seq;
        live.el.querySelector(".body").textContent += frame.text;
        live.el.dataset.status = "streaming";
        setMeta(live.el, "generating…");
        scrollDown();
        break;
      }
      case "completed":
      case "incomplete":
      case "failed":
      case "cancelled": {
        const live = state.live;
        if (!live || live.responseId !== frame.response_id) return;
        live.lastSeq = frame.seq;
        live.el.dataset.status = frame.type;
        const tokens = frame.usage ? frame.usage.completion_tokens : 0;
        if (frame.type === "completed") {
          const note = frame.finish_reason === "length" ? " · stopped at the length limit" : "";
          setMeta(live.el, tokens + " tokens" + note, "ok");
        } else if (frame.type === "cancelled") {
          setMeta(live.el, "Stopped · " + tokens + " tokens", "warn");
        } else {
          const why = frame.error && frame.error.message ? ": " + frame.error.message : "";
          setMeta(live.el, (frame.type === "failed" ? "Failed" : "Incomplete") + why, "error");
        }
        state.live = null;
        busy(false);
        break;
      }
      case "error": {
        if (frame.code === "model_warming_up" && state.pending && state.pending.frame) {
          // The server has just started and its model is still loading:
          // keep the message and send it again when the server says to.
          const pending = state.pending;
          const wait = Math.max(1, Math.ceil(frame.retry_after || 5));
          setMeta(pending.el, "The model is warming up; sending again in " + wait + " s…", "warn");
          clearTimeout(state.warmingTimer);
          state.warmingTimer = setTimeout(() => {
            if (state.pending === pending) send(pending.frame);
          }, wait * 1000);
          break;
        }
        if (state.pending) {
          // Refused before anything started: nothing was saved, so put the
          // text back for a retry.
          state.pending.el.remove();
          if (state.pending.userEl) state.pending.userEl.remove();
          if (state.pending.content && !prompt.value) prompt.value = state.pending.content;
          if (state.pending.replaced) state.pending.replaced.hidden = false;
          state.pending = null;
        }
        if (state.live && frame.code === "not_found") {
          // The reply ended while we were away and its stream is gone.
          state.live.el.dataset.status = "unknown";
          setMeta(state.live.el, "Reload to see the saved reply.", "warn");
          state.live = null;
        }
        showError(frame.message, frame.retry_after);
        busy(Boolean(state.live));
        break;
      }
    }
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + root.dataset.wsPath);
    state.socket = socket;
    socketStatus.textContent = "Connecting…";
    let opened = false;
    socket.onopen = () => {
      opened = true;
      state.retries = 0;
      socketStatus.textContent = "";
      if (state.live) {
        send({ type: "chat.resume", response_id: state.live.responseId, after_seq: state.live.lastSeq });
      }
      if (state.pending) {
        // The request may never have reached the server: say so rather
        // than guess whether it started.
        state.pending.el.remove();
        if (state.pending.userEl) state.pending.userEl.remove();
        prompt.value = prompt.value || state.pending.content || "";
        state.pending = null;
        showError("The connection dropped before the reply started; send again.");
        busy(Boolean(state.live));
      }
    };
    socket.onmessage = (event) => onFrame(JSON.parse(event.data));
    socket.onclose = (event) => {
      if (state.socket !== socket) return;
      if (event.code === 4401) {
        location.href = "/accounts/login/?next=" + encodeURIComponent(location.pathname);
        return;
      }
      if (event.code === 4403) {
        socketStatus.textContent = "Your account belongs to no tenant.";
        return;
      }
      const delay = Math.min(8000, 250 * 2 ** state.retries++);
      socketStatus.textContent = "Reconnecting…";
      if (!opened && state.retries > 1) {
        // Behind a real server a refused handshake is an HTTP 403, not a
        // 4401 close: ask the page itself whether the session has ended.
        fetch(location.pathname, { redirect: "manual" }).then((response) => {
          if (response.type === "opaqueredirect") location.reload();
        }, () => {});
      }
      setTimeout(connect, delay);
    };
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const content = prompt.value.trim();
    if (!content || state.live || state.pending) return;
    clearError();
    const frame = {
      type: "chat.send",
      conversation_id: state.conversationId,
      content,
      model: modelSelect.value,
    };
    if (!send(frame)) return;
    const userEl = bubble("user", content);
    const el = bubble("assistant", "", "pending");
    setMeta(el, "waiting for a worker…");
    state.pending = { el, userEl, content, frame };
    prompt.value = "";
    busy(true);
  });

  prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  stopButton.addEventListener("click", () => {
    if (state.live) send({ type: "chat.stop", response_id: state.live.responseId });
  });

  regenerateButton.addEventListener("click", () => {
    if (state.live || state.pending || state.conversationId === null) return;
    clearError();
    const frame = { type: "chat.regenerate", conversation_id: state.conversationId };
    if (!send(frame)) return;
    const replies = transcript.querySelectorAll('.msg[data-role="assistant"]');
    const last = replies[replies.length - 1];
    const lastMessage = transcript.lastElementChild;
    // The reply being replaced hides at once, and comes back if refused.
    const replaced = last && last === lastMessage ? last : null;
    if (replaced) replaced.hidden = true;
    const el = bubble("assistant", "", "pending");
    setMeta(el, "waiting for a worker…");
    state.pending = { el, userEl: null, content: "", replaced, frame };
    busy(true);
  });

  // A reply still generating when the page loaded (reload mid-reply): its
  // text so far is on the bus, not yet in the database; resume from seq 0.
  const inFlight = transcript.querySelector('.msg[data-status="in_progress"][data-response-id]');
  if (inFlight) {
    inFlight.querySelector(".body").textContent = "";
    state.live = { responseId: inFlight.dataset.responseId, lastSeq: 0, el: inFlight };
    busy(true);
  }
  connect();
})();
