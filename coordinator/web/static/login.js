// The login form: the token goes to POST /login once; the coordinator answers with a session
// cookie (HttpOnly, SameSite=Strict) that every later request carries.
'use strict';
document.getElementById('login').addEventListener('submit', async (event) => {
  event.preventDefault();
  const error = document.getElementById('login-error');
  error.hidden = true;
  const response = await fetch('/login', {
    method: 'POST',
    credentials: 'same-origin',
    headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({token: document.getElementById('token').value}),
  });
  if (response.ok) {
    location.href = '/';
    return;
  }
  let message = response.statusText;
  try {
    const body = await response.json();
    if (body.error) message = body.error.message;
  } catch (e) { /* not JSON: keep the status text */ }
  error.textContent = 'Refused: ' + message;
  error.hidden = false;
});
