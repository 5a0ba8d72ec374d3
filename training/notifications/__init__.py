"""In-app notifications: what waits for the signed-in person (the promotion requests they may
decide), with the evidence to decide them, and the nav's count of them."""
