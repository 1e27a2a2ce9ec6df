// candor label: one served answer at a time; 1 = correct, 2 = wrong, 0 = skip, arrows move.
// Each label is POSTed to the local server, which writes it to the store at once. The page holds one
// answer: each move asks the server for the answer at that position (GET /api/item?pos=N).
(function () {
  "use strict";
  const state = { item: null, pos: 0, total: 0, left: 0, busy: false, saved: 0 };
  const card = document.getElementById("card");
  const progress = document.getElementById("progress");
  const status = document.getElementById("status");
  // The token the server put in this page: a label without it is refused (another site cannot read it).
  const token = JSON.parse(document.getElementById("page-config").textContent).token;

  function row(list, term, value, cls) {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    dd.textContent = value;
    if (cls) dd.className = cls;
    list.append(dt, dd);
  }

  function verdict(item) {
    if (item.label === null) return ["not labelled", ""];
    const word = item.label ? "correct" : "wrong";
    return [word + " (" + item.label_source + ")", "verdict-" + word];
  }

  function render() {
    const n = state.total;
    card.replaceChildren();
    if (n === 0 || state.item === null) {
      progress.textContent = "No served answers to label.";
      return;
    }
    progress.textContent = state.left + " of " + n + " left to label · answer " + (state.pos + 1) + " of " + n;
    const item = state.item;
    const list = document.createElement("dl");
    row(list, "Question", item.question);
    row(list, "Answer", item.answer);
    row(list, "Confidence", item.confidence === null ? "—" : item.confidence.toFixed(3));
    if (item.reference.length) row(list, "Reference", item.reference.join(" · "));
    const [text, cls] = verdict(item);
    row(list, "Label", text, cls);
    card.append(list);
    card.dataset.id = item.id;
    card.dataset.index = String(item.index);
  }

  async function load(pos) {
    const query = pos === null ? "" : "?pos=" + pos;
    const response = await fetch("/api/item" + query, { cache: "no-store" });
    const data = await response.json();
    if (!response.ok) throw new Error(data.error);
    state.item = data.item;
    state.pos = data.pos;
    state.total = data.total;
    state.left = data.left;
    render();
  }

  async function move(step) {
    const pos = Math.min(Math.max(state.pos + step, 0), Math.max(state.total - 1, 0));
    state.busy = true;
    try {
      await load(pos);
    } catch (err) {
      status.textContent = "Could not load the answer: " + err;
    } finally {
      state.busy = false;
    }
  }

  async function mark(correct) {
    const item = state.item;
    if (!item || state.busy) return;
    state.busy = true;
    try {
      const response = await fetch("/api/label", {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Candor-Page-Token": token },
        body: JSON.stringify({ id: item.id, index: item.index, correct: correct }),
      });
      const data = await response.json();
      if (!response.ok) {
        status.textContent = "Not saved: " + data.error;
        return;
      }
      state.left = data.left;
      status.textContent = "Saved: " + (correct ? "correct" : "wrong") + ".";
      state.busy = false;
      await move(1);
      state.saved += 1;
      document.body.dataset.saved = String(state.saved);
    } catch (err) {
      status.textContent = "Not saved: " + err;
    } finally {
      state.busy = false;
    }
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const actions = {
      "1": () => mark(true),
      "2": () => mark(false),
      "0": () => { status.textContent = "Skipped."; move(1); },
      ArrowRight: () => move(1),
      ArrowLeft: () => move(-1),
    };
    const action = actions[event.key];
    if (action && !state.busy) {
      event.preventDefault();
      action();
    }
  });

  load(null)
    .then(() => { document.body.dataset.ready = "1"; })
    .catch((err) => { status.textContent = "Could not load the answers: " + err; });
})();
