DROP TABLE {{.DLQReplays}};
DROP TABLE {{.ParkedMessages}};
