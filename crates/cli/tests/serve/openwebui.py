"""Open WebUI (a chat UI) in front of `llamay serve`, driven through Open WebUI's own
HTTP API and its socket.io channel, as its browser front end drives them.

usage: python openwebui.py OPEN_WEBUI_URL MODEL (ollama|openai)

Open WebUI reaches llamay through its Ollama connection or its OpenAI one (the mode says
which it was started with). The checks: the first user signs up as admin; the admin sets
the model's parameters as the admin screen does (answers bounded; Open WebUI 0.12's
built-in tools off: their ~30 schemas are 7.6k prompt tokens on every UI turn, beyond a
4096-token context, and a 270M base model loops on them); Open WebUI lists the model;
a chat answer whole and streamed; the UI's parameters; title generation; the browser's
flow (a socket session, the answer as socket events, the chat and its title stored, a
second turn); in Ollama mode Open WebUI's Ollama passthrough routes. Exit 1 on any
failed check. The served Gemma file is a base model: answers are checked for being
there, not for what they say.
"""
import asyncio
import json
import os
import sys
import time
import uuid

import requests
import socketio

BASE, MODEL, MODE = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
FAILS = []
# LLAMAY_TEST_TIME_SCALE stretches the waits for a slow device (lavapipe).
SCALE = float(os.environ.get("LLAMAY_TEST_TIME_SCALE", "1"))


def show(tag, r, n=300):
    print(f"--- {tag}: {r.request.method} {r.request.path_url} -> {r.status_code} ({r.elapsed.total_seconds():.2f}s)")
    print("    " + r.text[:n].replace("\n", "\\n") + (" ..." if len(r.text) > n else ""))
    return r


def check(ok, what):
    print(("  PASS " if ok else "  FAIL ") + what, flush=True)
    if not ok:
        FAILS.append(what)


s = requests.Session()
r = show("config", s.get(f"{BASE}/api/config"))
check(r.ok and r.json().get("version"), "GET /api/config")
r = show("signup", s.post(f"{BASE}/api/v1/auths/signup",
                          json={"name": "CI Admin", "email": "admin@example.com", "password": "ci-password-123"}))
j = r.json()
check(r.ok and j.get("role") == "admin" and j.get("token"), "the first user signs up as admin")
TOKEN = j["token"]
H = {"Authorization": f"Bearer {TOKEN}"}
s.headers.update(H)

# What the admin screen does (Admin > Settings > Models > edit).
r = show("model settings", s.post(f"{BASE}/api/v1/models/create", json={
    "id": MODEL, "name": MODEL, "base_model_id": None,
    "meta": {"capabilities": {"builtin_tools": False}},
    "params": {"max_tokens": 48, "function_calling": "legacy"}}))
check(r.ok, "POST /api/v1/models/create (the model's parameters)")
r = show("models", s.get(f"{BASE}/api/models"))
models = r.json().get("data", [])
check(MODEL in [m["id"] for m in models], f"GET /api/models lists {MODEL}")

msgs = [{"role": "user", "content": "Say hello in five words."}]
r = show("chat", s.post(f"{BASE}/api/chat/completions",
                        json={"model": MODEL, "messages": msgs, "stream": False, "params": {"max_tokens": 48}}))
try:
    content = r.json()["choices"][0]["message"]["content"]
except (KeyError, IndexError, ValueError):
    content = None
check(r.ok and content, f"POST /api/chat/completions -> {content!r:.80}")

r = s.post(f"{BASE}/api/chat/completions", stream=True,
           json={"model": MODEL, "messages": msgs, "stream": True, "params": {"max_tokens": 48}})
# Bytes, split at ASCII line ends only: SSE's line ends (str.splitlines would also split at
# U+2028 or U+0085, which a JSON string may carry raw).
lines = [line.decode() for line in r.iter_lines() if line]
text = ""
for line in lines:
    if line.startswith("data: ") and line != "data: [DONE]":
        d = json.loads(line[6:])
        text += ((d.get("choices") or [{}])[0].get("delta") or {}).get("content") or ""
print(f"--- chat streamed: {r.status_code}, {len(lines)} lines, {r.headers.get('content-type')}")
check(r.ok and text and lines[-1] == "data: [DONE]", f"streamed -> {text!r:.80}")

r = show("chat with the UI's parameters", s.post(f"{BASE}/api/chat/completions", json={
    "model": MODEL, "messages": msgs, "stream": False,
    "params": {"temperature": 0.2, "max_tokens": 16, "seed": 42, "top_p": 0.9, "stop": ["\n\n"]}}))
check(r.ok and r.json()["choices"][0]["message"]["content"] is not None, "temperature, seed, top_p, stop, max_tokens")

conversation = msgs + [{"role": "assistant", "content": content or "Hello there, how are you?"}]
r = show("title", s.post(f"{BASE}/api/v1/tasks/title/completions", json={"model": MODEL, "messages": conversation}))
check(r.ok, "POST /api/v1/tasks/title/completions")


async def browser():
    """The browser's flow: a socket session; the answer arrives as socket events."""
    sio = socketio.AsyncClient()
    events = []
    done = asyncio.Event()

    @sio.on("events")
    async def on_event(data):
        events.append(data)
        d = data.get("data") or {}
        if (d.get("type") == "chat:completion" and (d.get("data") or {}).get("done")) \
                or d.get("type") == "chat:message:error":
            done.set()

    def kinds(evs):
        return [(e.get("data") or {}).get("type") for e in evs]

    def finals(evs):
        return [e["data"]["data"] for e in evs if (e.get("data") or {}).get("type") == "chat:completion"
                and (e["data"].get("data") or {}).get("done")]

    def errors(evs):
        return [e["data"]["data"] for e in evs if (e.get("data") or {}).get("type") == "chat:message:error"]

    await sio.connect(BASE, socketio_path="/ws/socket.io", auth={"token": TOKEN}, transports=["websocket"])
    await sio.emit("user-join", {"auth": {"token": TOKEN}})
    await asyncio.sleep(0.5)
    user_id, reply_id = str(uuid.uuid4()), str(uuid.uuid4())
    question = "What is the capital of France?"
    user_message = {"id": user_id, "parentId": None, "childrenIds": [reply_id], "role": "user",
                    "content": question, "timestamp": int(time.time()), "models": [MODEL]}
    body = {"stream": True, "model": MODEL, "messages": [{"role": "user", "content": question}],
            "params": {}, "tool_ids": [], "tool_servers": [],
            "features": {"voice": False, "image_generation": False, "code_interpreter": False, "web_search": False},
            "variables": {"{{USER_NAME}}": "CI Admin"},
            "model_item": next(m for m in models if m["id"] == MODEL),
            "session_id": sio.sid, "id": reply_id, "parent_id": None, "user_message": user_message,
            "background_tasks": {"title_generation": True, "tags_generation": False, "follow_up_generation": False}}
    r = show("browser chat", requests.post(f"{BASE}/api/chat/completions", json=body, headers=H))
    chat_id = r.json().get("chat_id") if r.ok else None
    check(chat_id, "the browser's POST /api/chat/completions returns a chat_id")
    try:
        await asyncio.wait_for(done.wait(), 120 * SCALE)
    except asyncio.TimeoutError:
        pass
    deadline = time.time() + 60 * SCALE
    while time.time() < deadline and "chat:title" not in kinds(events):
        await asyncio.sleep(0.5)
    if errors(events):
        print("    error events:", json.dumps(errors(events))[:600])
    check(finals(events) and not errors(events), "the answer arrives as socket events, done, no error")
    check("chat:title" in kinds(events), "a chat:title event")
    answer = finals(events)[-1].get("content", "") if finals(events) else ""
    if chat_id and answer:
        done.clear()
        seen = len(events)
        user2, reply2 = str(uuid.uuid4()), str(uuid.uuid4())
        message2 = {"id": user2, "parentId": reply_id, "childrenIds": [reply2], "role": "user",
                    "content": "And of Germany?", "timestamp": int(time.time()), "models": [MODEL]}
        body2 = {**body, "chat_id": chat_id, "id": reply2, "parent_id": reply_id, "user_message": message2,
                 "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer},
                              {"role": "user", "content": message2["content"]}],
                 "background_tasks": {}}
        r = show("browser chat, second turn", requests.post(f"{BASE}/api/chat/completions", json=body2, headers=H))
        try:
            await asyncio.wait_for(done.wait(), 120 * SCALE)
        except asyncio.TimeoutError:
            pass
        later = events[seen:]
        check(r.ok and finals(later) and not errors(later), "a second turn in the same chat")
    await sio.disconnect()
    return chat_id, reply_id


chat_id, reply_id = asyncio.run(browser())
if chat_id:
    r = show("stored chat", s.get(f"{BASE}/api/v1/chats/{chat_id}"))
    chat = r.json().get("chat", {})
    stored = chat.get("history", {}).get("messages", {}).get(reply_id, {})
    check(stored.get("done") and stored.get("content"), "the answer is stored with the chat")
    check(chat.get("title") not in (None, "", "New Chat"), f"the chat has a title ({chat.get('title')!r:.60})")

if MODE == "ollama":
    r = show("ollama passthrough chat", s.post(f"{BASE}/ollama/api/chat", json={
        "model": MODEL, "messages": msgs, "stream": False, "options": {"num_predict": 16}}))
    check(r.ok and r.json().get("message", {}).get("content") is not None, "POST /ollama/api/chat")
    r = show("ollama passthrough generate", s.post(f"{BASE}/ollama/api/generate", json={
        "model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 8}}))
    check(r.ok, "POST /ollama/api/generate")
    r = show("ollama passthrough show", s.post(f"{BASE}/ollama/api/show", json={"model": MODEL}))
    check(r.ok, "POST /ollama/api/show")

print(f"\n{MODE}: {len(FAILS)} checks failed" + (": " + "; ".join(FAILS) if FAILS else ""))
sys.exit(1 if FAILS else 0)
